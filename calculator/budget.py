"""Bounded work: a deadline and a cancel flag that long computations check between steps.

``with deadline(5.0): plan(...)`` stops the plan with ``DeadlineExceeded`` once 5 s have passed;
the search loops call ``check()`` between configurations, so the work really stops (it is not
merely abandoned in a thread). The REST API runs each heavy request under a deadline and sets
the cancel flag when the client disconnects. The budget is a context variable: it follows the
code into the thread that runs it (``contextvars.copy_context``), and a call with no budget set
pays one lookup.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from .errors import Cancelled, DeadlineExceeded


@dataclass(frozen=True)
class Budget:
    """A monotonic-clock deadline (``None``: none) and a cancel flag."""

    seconds: float | None
    deadline: float | None
    cancelled: threading.Event = field(default_factory=threading.Event)

    def check(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled()
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise DeadlineExceeded(self.seconds or 0.0)

    def remaining_s(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()


_BUDGET: ContextVar[Budget | None] = ContextVar("pdplan_budget", default=None)


def check() -> None:
    """Raise ``DeadlineExceeded`` or ``Cancelled`` if the current budget is spent; else nothing."""
    b = _BUDGET.get()
    if b is not None:
        b.check()


def current() -> Budget | None:
    return _BUDGET.get()


@contextmanager
def deadline(seconds: float | None, cancelled: threading.Event | None = None) -> Iterator[Budget]:
    """Run the block under a budget of ``seconds`` (``None``: no deadline) and an optional cancel flag.
    A nested budget never extends an outer one."""
    if seconds is not None and not seconds > 0:
        from .errors import InputError

        raise InputError("seconds", f"a deadline must be > 0 seconds, got {seconds!r}")
    now = time.monotonic()
    end = None if seconds is None else now + seconds
    outer = _BUDGET.get()
    if outer is not None and outer.deadline is not None and (end is None or outer.deadline < end):
        end, seconds = outer.deadline, outer.seconds
    flag = cancelled or (outer.cancelled if outer is not None else threading.Event())
    token = _BUDGET.set(Budget(seconds, end, flag))
    try:
        yield _BUDGET.get()  # type: ignore[misc]
    finally:
        _BUDGET.reset(token)
