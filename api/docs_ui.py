"""Swagger UI at ``/docs`` and ReDoc at ``/redoc`` with their scripts, styles and favicon served by the app
itself from ``api/static/vendor/`` (see its README for the npm packages and versions), not from a CDN,
so that both work offline and behind a firewall.

FastAPI's own pages load the same bundles from cdn.jsdelivr.net and the favicon from
fastapi.tiangolo.com; this module builds the pages with FastAPI's ``get_swagger_ui_html`` and
``get_redoc_html`` pointed at local copies. Two fetches remain inside the bundles themselves: Swagger
UI's online-validator badge (an image from validator.swagger.io, switched off with
``validatorUrl: null``) and the Redocly logo in ReDoc's sidebar (an image from cdn.redoc.ly). The
pages' Content-Security-Policy allows this host alone, so the browser refuses such a fetch instead
of sending it."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_URL = "/static"
SWAGGER_UI = "vendor/swagger-ui"
REDOC = "vendor/redoc"
FAVICON = f"{SWAGGER_UI}/favicon-32x32.png"
# 'unsafe-inline': FastAPI's page starts Swagger UI from an inline script, and both UIs inject styles;
# ReDoc runs its search in a worker made from a blob.
CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data:; worker-src 'self' blob:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")


def install(app: FastAPI) -> None:
    """Mount ``/static`` and add ``/docs``, its OAuth2 redirect and ``/redoc`` to an app built with
    ``docs_url=None, redoc_url=None``."""
    app.mount(STATIC_URL, StaticFiles(directory=STATIC_DIR), name="static")
    title = app.title
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2_redirect_url = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    def prefix(request: Request) -> str:
        """The path the app is served under behind a proxy (``root_path``), as FastAPI's own pages use it."""
        return request.scope.get("root_path", "").rstrip("/")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root, static = prefix(request), prefix(request) + STATIC_URL
        page = get_swagger_ui_html(
            openapi_url=root + openapi_url, title=f"{title} - Swagger UI",
            swagger_js_url=f"{static}/{SWAGGER_UI}/swagger-ui-bundle.js",
            swagger_css_url=f"{static}/{SWAGGER_UI}/swagger-ui.css", swagger_favicon_url=f"{static}/{FAVICON}",
            oauth2_redirect_url=root + oauth2_redirect_url, init_oauth=app.swagger_ui_init_oauth,
            swagger_ui_parameters={**(app.swagger_ui_parameters or {}), "validatorUrl": None})
        page.headers["content-security-policy"] = CSP
        return page

    @app.get(oauth2_redirect_url, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root, static = prefix(request), prefix(request) + STATIC_URL
        page = get_redoc_html(openapi_url=root + openapi_url, title=f"{title} - ReDoc",
                              redoc_js_url=f"{static}/{REDOC}/redoc.standalone.js",
                              redoc_favicon_url=f"{static}/{FAVICON}", with_google_fonts=False)
        page.headers["content-security-policy"] = CSP
        return page
