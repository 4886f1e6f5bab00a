"""pdplan's exception family. Every error pdplan raises on purpose is a ``PdplanError``.

- ``InputError`` (also a ``ValueError``): an argument or request field is invalid. ``field`` is the
  dotted path of what was wrong (``workload.isl.samples``), ``reason`` says why; ``str()`` is
  ``"field: reason"``. The REST API answers it with 422 naming the field; the CLI prints it on one
  line and exits 2.
- ``UnknownIdError`` (an ``InputError``, also a ``KeyError`` for old callers): a model or GPU id
  not in the database; ``closest`` lists the nearest known ids (REST: 404). ``AmbiguousIdError``, one
  of them, is a name several entries answer to; ``closest`` lists each.
- ``HardwareDBError``: a hardware YAML file cannot be read or is invalid. For the bundled database
  or the server's ``PDPLAN_HARDWARE_DB`` file this is a server-side fault (REST: 503); for a file
  a user passed it is their input.

It lives in ``hardware_db`` (the lowest layer) so that the database and the calculator raise the
same classes; ``calculator.errors`` adds the ones only the calculator raises.
"""

from __future__ import annotations

import difflib
import os


class PdplanError(Exception):
    """Base of every error pdplan raises on purpose."""


class InputError(PdplanError, ValueError):
    """An invalid argument or request field: ``field`` names it, ``reason`` says why."""

    def __init__(self, field: str, reason: str) -> None:
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}" if field else reason)


def closest_ids(wanted: str, known: list[str], n: int = 3) -> list[str]:
    """Up to ``n`` known ids nearest ``wanted``, in any case: the longest shared prefix first (``h200`` →
    ``h200-sxm`` before ``h20``), then difflib's similarity; an id sharing under two leading characters
    must be similar (ratio ≥ 0.4)."""
    key = str(wanted).lower()

    def score(k: str) -> tuple[int, float]:
        shared = len(os.path.commonprefix([key, k]))
        return shared, difflib.SequenceMatcher(None, key, k).ratio()

    ranked = sorted(known, key=lambda k: tuple(-x for x in score(k)))
    return [k for k in ranked if score(k)[0] >= 2 or score(k)[1] >= 0.4][:n]


class UnknownIdError(InputError, KeyError):
    """An id that is not in the database; the message names the closest known ids."""

    def __init__(self, kind: str, wanted: str, known: list[str], field: str | None = None):
        self.kind, self.wanted, self.known = kind, wanted, known
        self.closest = closest_ids(wanted, known)
        InputError.__init__(self, field or ("gpu" if kind == "GPU" else kind), self._message())

    def _message(self) -> str:
        hint = f"; closest: {', '.join(self.closest)}" if self.closest else f"; known: {', '.join(self.known[:12])}..."
        return f"unknown {self.kind} id {self.wanted!r}{hint}"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.reason)


class AmbiguousIdError(UnknownIdError):
    """A name that several entries answer to (an alias they share, or a prefix of each id); ``known``
    and ``closest`` are those entries' ids, and the message lists them."""

    def __init__(self, kind: str, wanted: str, candidates: list[str], field: str | None = None):
        super().__init__(kind, wanted, candidates, field)
        self.closest = list(candidates)

    def _message(self) -> str:
        return (f"ambiguous {self.kind} id {self.wanted!r}: it names {', '.join(self.known)}; "
                "give one of these ids")


class HardwareDBError(PdplanError):
    """A hardware YAML file that cannot be read or does not match the schema; the message names the
    file, the entry and the field."""
