"""``serve``: uvicorn with the timeouts a public-facing process needs.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive`` seconds, but a connection
that sends nothing, or half a request, is held forever (each one a slow-loris slot).
``GuardedHttpToolsProtocol`` closes a connection whose request has not fully arrived (headers and
body) within ``request_read_timeout_s`` of its first byte, or of the connection's opening. Behind
a reverse proxy, the proxy's own timeouts do this too."""

from __future__ import annotations

import asyncio
import os

from .compute import ENV_DEADLINE

REQUEST_READ_TIMEOUT_S = 10.0
ENV_READ_TIMEOUT = "PDPLAN_READ_TIMEOUT_S"
KEEP_ALIVE_TIMEOUT_S = 5
LIMIT_CONCURRENCY = 512
"""Connections plus in-flight requests per worker before uvicorn answers 503."""

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # httptools missing: uvicorn's h11 protocol, without the read timeout
    HttpToolsProtocol = None  # type: ignore[assignment,misc]


if HttpToolsProtocol is not None:

    class GuardedHttpToolsProtocol(HttpToolsProtocol):  # type: ignore[misc,valid-type]
        """uvicorn's httptools protocol plus a deadline on reading each request."""

        request_read_timeout_s = float(os.environ.get(ENV_READ_TIMEOUT) or REQUEST_READ_TIMEOUT_S)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            self._read_timer: asyncio.TimerHandle | None = None
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            if self._read_timer is None:
                self._read_timer = self.loop.call_later(self.request_read_timeout_s, self._read_timed_out)

        def _disarm(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def _read_timed_out(self) -> None:
            self._read_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self.cycle is None or self.cycle.response_complete:  # bytes of a new request
                self._arm()
            super().data_received(data)

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)
else:
    GuardedHttpToolsProtocol = None  # type: ignore[assignment,misc]


def serve(host: str = "127.0.0.1", port: int = 8000, workers: int = 1, deadline_s: float | None = None,
          request_read_timeout_s: float | None = None) -> None:
    """Run ``api:app`` under uvicorn (``workers`` processes) with the deadline and the timeouts
    (``None``: ``PDPLAN_DEADLINE_S`` / ``PDPLAN_READ_TIMEOUT_S`` or the defaults)."""
    import uvicorn

    if deadline_s is not None:  # the environment reaches every worker process
        os.environ[ENV_DEADLINE] = str(deadline_s)
    if request_read_timeout_s is not None:
        os.environ[ENV_READ_TIMEOUT] = str(request_read_timeout_s)
    http: object = "auto"
    if GuardedHttpToolsProtocol is not None:
        GuardedHttpToolsProtocol.request_read_timeout_s = float(
            os.environ.get(ENV_READ_TIMEOUT) or REQUEST_READ_TIMEOUT_S)
        http = GuardedHttpToolsProtocol
    uvicorn.run("api:app", host=host, port=port, workers=workers, http=http,  # type: ignore[arg-type]
                timeout_keep_alive=KEEP_ALIVE_TIMEOUT_S, limit_concurrency=LIMIT_CONCURRENCY,
                access_log=False)
