"""The planner web page: ``/`` and its assets under ``/ui/`` (``api/web/``: plain HTML, vanilla
JavaScript and a vendored Chart.js; no build step).

The page is one more client of the REST API: it posts ``/v1/plan``, ``/v1/sweep`` and
``/v1/evaluate`` and formats what they return, never computing a figure of its own. It loads
nothing from another host, and the page's Content-Security-Policy allows this host alone, so an
asset or a request that reached for a CDN would be refused by the browser rather than slip by."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

WEB_DIR = Path(__file__).resolve().parents[1] / "web"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")

router = APIRouter(include_in_schema=False)
_assets = StaticFiles(directory=WEB_DIR, check_dir=False)


@router.get("/")
async def index() -> FileResponse:
    """The page; revalidated on every load so that a new version is picked up at once."""
    return FileResponse(WEB_DIR / "index.html", media_type="text/html",
                        headers={"content-security-policy": CSP, "cache-control": "no-cache"})


@router.get("/ui/{path:path}")
async def asset(path: str, request: Request) -> Response:
    """A file under ``api/web/`` (Starlette's StaticFiles: no path outside it, ETag and 304)."""
    response = await _assets.get_response(path, request.scope)
    response.headers.setdefault("cache-control", "no-cache")
    return response
