"""The errors pdplan raises, one family (see ``hardware_db.errors`` for the shared base):

=====================  ==========================  ===========================================
class                  also a                      raised when
=====================  ==========================  ===========================================
``PdplanError``        ``Exception``               base of all below
``InputError``         ``ValueError``              an argument is invalid (``field``, ``reason``)
``UnknownIdError``     ``InputError``, ``KeyError`` a model or GPU id is not in the database
``AmbiguousIdError``  ``UnknownIdError``          a name several entries answer to (``h100``)
``UnstableError``      ``InputError``              a percentile is asked of a deployment that the
                                                    rate overloads
``HardwareDBError``    ``PdplanError``             a hardware YAML file is unreadable or invalid
``DeadlineExceeded``   ``TimeoutError``            work ran past its ``pc.deadline(...)``
``Cancelled``          ``PdplanError``             work was cancelled (the REST client went away)
=====================  ==========================  ===========================================
"""

from __future__ import annotations

from hardware_db.errors import AmbiguousIdError, HardwareDBError, InputError, PdplanError, UnknownIdError

__all__ = ["AmbiguousIdError", "Cancelled", "DeadlineExceeded", "HardwareDBError", "InputError", "PdplanError", "UnknownIdError",
           "UnstableError"]


class UnstableError(InputError):
    """A latency percentile of a deployment that cannot keep up with the arrival rate."""


class DeadlineExceeded(PdplanError, TimeoutError):
    """Work stopped at its deadline; ``seconds`` is the budget it had."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        super().__init__(f"the computation exceeded its {seconds:g} s deadline and was stopped; "
                         "narrow the search (fewer GPUs, tps, chunk sizes, samples or sweep points)")


class Cancelled(PdplanError):
    """Work stopped because whoever asked for it no longer waits for the answer."""

    def __init__(self) -> None:
        super().__init__("the computation was cancelled")
