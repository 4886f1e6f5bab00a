"""Running a request's computation under a deadline, off the event loop, stopped when the client
goes away.

Fast, bounded work (a KV-cache query, one estimate: about a millisecond) runs on the event loop.
Anything that searches (plan, evaluate, sweep) runs in a worker thread under
``calculator.budget.deadline``: the search loops check the budget between configurations, so a
request past its deadline really stops and answers 504, and one whose client disconnected stops
at the next check. At most ``max_concurrent`` heavy computations run at once per process; one
that cannot start before its deadline answers 503. The event loop meanwhile keeps answering
health checks (the worker thread releases the GIL at least every switch interval, 5 ms)."""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import Request

from calculator.budget import deadline
from calculator.errors import DeadlineExceeded
from calculator.limits import DEFAULT_DEADLINE_S

T = TypeVar("T")
ENV_DEADLINE = "PDPLAN_DEADLINE_S"
DISCONNECT_POLL_S = 0.05


class Busy(Exception):
    """No computation slot freed up before the request's deadline."""


def deadline_from_env() -> float:
    """The per-request deadline in seconds: ``PDPLAN_DEADLINE_S`` if set and valid, else the default."""
    text = os.environ.get(ENV_DEADLINE, "")
    try:
        value = float(text)
    except ValueError:
        return DEFAULT_DEADLINE_S
    return value if 0 < value <= 3600 else DEFAULT_DEADLINE_S


class Runner:
    """Heavy computations for one app: a thread pool, a concurrency cap and the deadline."""

    def __init__(self, deadline_s: float | None = None, max_concurrent: int = 4) -> None:
        self._deadline_s = deadline_s
        self.max_concurrent = max_concurrent
        self._pool = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="pdplan-compute")
        self._slots: asyncio.Semaphore | None = None

    @property
    def deadline_s(self) -> float:
        """The deadline given to the app, else ``PDPLAN_DEADLINE_S`` as it is now (``pdplan serve``
        sets it after this module may have been imported), else the default."""
        return self._deadline_s or deadline_from_env()

    async def run(self, request: Request, fn: Callable[..., T], *args: Any) -> T:
        start, limit_s = time.monotonic(), self.deadline_s
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_concurrent)
        try:
            await asyncio.wait_for(self._slots.acquire(), timeout=limit_s)
        except TimeoutError:
            raise Busy() from None
        try:
            remaining = limit_s - (time.monotonic() - start)
            if remaining <= 0:
                raise DeadlineExceeded(limit_s)
            cancelled = threading.Event()

            def work() -> T:
                with deadline(remaining, cancelled):
                    return fn(*args)

            ctx = contextvars.copy_context()
            future = asyncio.get_running_loop().run_in_executor(self._pool, ctx.run, work)
            watcher = asyncio.ensure_future(_watch_disconnect(request, cancelled))
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                cancelled.set()  # the server is cancelling this request: stop the thread's work too
                raise
            finally:
                watcher.cancel()
        finally:
            self._slots.release()


async def _watch_disconnect(request: Request, cancelled: threading.Event) -> None:
    """Set ``cancelled`` when the client disconnects (the body has been read already, so the next
    ASGI message is the disconnect)."""
    while not cancelled.is_set():
        if await request.is_disconnected():
            cancelled.set()
            return
        await asyncio.sleep(DISCONNECT_POLL_S)
