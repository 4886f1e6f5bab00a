"""pdplan's exception family. Every error pdplan raises on purpose is a ``PdplanError``.

- ``InputError`` (also a ``ValueError``): an argument or request field is invalid. ``field`` is the
  dotted path of what was wrong (``workload.isl.samples``), ``reason`` says why; ``str()`` is
  ``"field: reason"``. The REST API answers it with 422 naming the field; the CLI prints it on one
  line and exits 2.
- ``UnknownIdError`` (an ``InputError``, also a ``KeyError`` for old callers): a model or GPU id
  not in the database; ``closest`` lists the nearest known ids (REST: 404).
- ``HardwareDBError``: a hardware YAML file cannot be read or is invalid. For the bundled database
  or the server's ``PDPLAN_HARDWARE_DB`` file this is a server-side fault (REST: 503); for a file
  a user passed it is their input.

It lives in ``hardware_db`` (the lowest layer) so that the database and the calculator raise the
same classes; ``calculator.errors`` adds the ones only the calculator raises.
"""

from __future__ import annotations

import difflib


class PdplanError(Exception):
    """Base of every error pdplan raises on purpose."""


class InputError(PdplanError, ValueError):
    """An invalid argument or request field: ``field`` names it, ``reason`` says why."""

    def __init__(self, field: str, reason: str) -> None:
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}" if field else reason)


class UnknownIdError(InputError, KeyError):
    """An id that is not in the database; the message names the closest known ids."""

    def __init__(self, kind: str, wanted: str, known: list[str], field: str | None = None):
        self.kind, self.wanted, self.known = kind, wanted, known
        self.closest = difflib.get_close_matches(str(wanted).lower(), known, n=3, cutoff=0.4)
        hint = f"; closest: {', '.join(self.closest)}" if self.closest else f"; known: {', '.join(known[:12])}..."
        InputError.__init__(self, field or ("gpu" if kind == "GPU" else kind), f"unknown {kind} id {wanted!r}{hint}")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.reason)


class HardwareDBError(PdplanError):
    """A hardware YAML file that cannot be read or does not match the schema; the message names the
    file, the entry and the field."""
