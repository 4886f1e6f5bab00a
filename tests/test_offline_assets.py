"""Offline: the API's documentation pages and the docs site load nothing from another host.

Swagger UI (``/docs``) and ReDoc (``/redoc``) take their scripts, styles and favicon from the app
(``api/static/vendor``), and the mkdocs site takes MathJax from ``docs/assets/vendor`` and the
system fonts; a CDN URL put back in either fails here. Hyperlinks (``<a href>``) to other sites are
fine: a reader follows them, the page does not load them."""

from __future__ import annotations

import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
from fastapi.testclient import TestClient

from api.app import create_app

ROOT = Path(__file__).resolve().parents[1]
HOST = re.compile(r"(?:\b[a-z][a-z0-9+.-]*:)?//[a-z0-9-]+(?:\.[a-z0-9-]+)+", re.IGNORECASE)
"""A host in a URL, ``https://cdn.example.org`` or scheme-relative ``//cdn.example.org``."""
CSS_URL = re.compile(r"""url\(\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^)]*?)\s*\)"""
                     r"""|@import\s+(?:url\(\s*)?("[^"]*"|'[^']*'|[^\s;)]+)""", re.IGNORECASE)
LINK_RELS_THAT_LOAD = {"stylesheet", "icon", "apple-touch-icon", "mask-icon", "manifest", "preload", "prefetch",
                       "modulepreload", "preconnect", "dns-prefetch"}
LOADING_ATTRS = {"src", "srcset", "poster", "data", "spec-url", "xlink:href"}


def is_external(url: str) -> bool:
    """Whether a browser goes to another host for ``url``: an absolute or a scheme-relative URL. A path,
    a relative URL, a fragment, ``data:`` and ``blob:`` stay on this host."""
    url = url.strip().lower()
    return url.startswith("//") or (re.match(r"[a-z][a-z0-9+.-]*:", url) is not None
                                    and not url.startswith(("data:", "blob:")))


def css_urls(css: str) -> list[str]:
    """The URLs of a style sheet's ``url(...)`` and ``@import``, unquoted."""
    return [(m.group(1) or m.group(2) or "").strip("'\"") for m in CSS_URL.finditer(css)]


class Refs(HTMLParser):
    """What a page loads (``loads``: the sources of scripts, images, media, frames, stylesheet and icon
    links, ``url()`` and ``@import`` of its styles), what it links to (``links``) and its inline scripts."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.loads: list[str] = []
        self.links: list[str] = []
        self.scripts: list[str] = []
        self._inline: str | None = None
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        for name in LOADING_ATTRS & a.keys():
            self.loads += [c.split()[0] for c in a[name].split(",") if c.strip()] if name == "srcset" else [a[name]]
        if "href" in a:
            rels = set(a.get("rel", "").lower().split())
            hyperlink = tag == "a" or (tag == "link" and not rels & LINK_RELS_THAT_LOAD)
            (self.links if hyperlink else self.loads).append(a["href"])  # else: <base>, <image>/<use> in SVG
        self.loads += css_urls(a.get("style", ""))
        self._inline = tag if tag in ("script", "style") and "src" not in a else None

    def handle_endtag(self, tag: str) -> None:
        self._inline = None

    def handle_data(self, data: str) -> None:
        if self._inline == "script":
            self.scripts.append(data)
        elif self._inline == "style":
            self.loads += css_urls(data)


# ------------------------------------------------------------------------------------ /docs and /redoc

@pytest.fixture(scope="module", params=["", "/pdplan"], ids=["at-root", "behind-a-proxy-prefix"])
def api(request: pytest.FixtureRequest) -> tuple[TestClient, str]:
    """A client of the app, served at the root or under a proxy's path prefix (``root_path``)."""
    return TestClient(create_app(), root_path=request.param), request.param


def expected_type(path: str) -> str:
    if path.endswith(".js"):
        return "javascript"
    return {".css": "text/css", ".png": "image/png", ".json": "application/json"}.get(Path(path).suffix, "text/html")


@pytest.mark.parametrize("page, kinds", [("/docs", {".js", ".css", ".png", ".json", "oauth2-redirect"}),
                                         ("/redoc", {".js", ".png", ".json"})])
def test_api_doc_pages_load_everything_from_this_host(api, page, kinds):
    client, prefix = api
    r = client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert HOST.findall(r.text) == [], "the page names another host"
    refs = Refs(r.text)
    # the URLs the inline script hands Swagger UI: the OpenAPI schema and the OAuth2 redirect page
    in_scripts = [m.group(2) for s in refs.scripts for m in re.finditer(r"""(['"])(/[^'"\s]*)\1""", s)]
    urls = refs.loads + refs.links + in_scripts
    assert all(u.startswith(prefix + "/") and not u.startswith("//") for u in urls), urls
    found = {"oauth2-redirect" if u.endswith("oauth2-redirect") else Path(u).suffix for u in urls}
    assert kinds <= found, f"{page} no longer references {kinds - found}: {urls}"
    for url in urls:
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert expected_type(url) in asset.headers["content-type"], (url, asset.headers["content-type"])
        assert len(asset.content) > 500, url  # the smallest, the favicon, is 628 bytes
        if url.endswith(".css"):
            assert [u for u in css_urls(asset.text) if is_external(u)] == [], url


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_api_doc_pages_forbid_other_hosts(api, page):
    """The bundles still ask for images from elsewhere (ReDoc's sidebar logo from cdn.redoc.ly): the
    Content-Security-Policy names no host but this one, so the browser refuses such a request."""
    client, _ = api
    policy = client.get(page).headers["content-security-policy"]
    directives = {d.split()[0]: d.split()[1:] for d in policy.split(";") if d.strip()}
    assert directives["default-src"] == ["'self'"]
    allowed = {"'self'", "'none'", "'unsafe-inline'", "data:", "blob:"}
    assert {s for sources in directives.values() for s in sources} <= allowed, policy


def test_swagger_ui_online_validator_is_off(api):
    """Swagger UI's default shows a badge loaded from validator.swagger.io, sending it the schema's URL."""
    client, _ = api
    assert '"validatorUrl": null' in client.get("/docs").text


def test_oauth2_redirect_page(api):
    client, _ = api
    r = client.get("/docs/oauth2-redirect")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "swaggerUIRedirectOauth2" in r.text and HOST.findall(r.text) == []


# ------------------------------------------------------------------------------------ the mkdocs site

ON_DEMAND = {
    "https://unpkg.com/mermaid@": "Material, for a page with a Mermaid diagram (none has one: see below)",
    "https://unpkg.com/resize-observer-polyfill": "Material, in a browser without ResizeObserver",
    "https://cdn.jsdelivr.net/npm/wicked-good-xpath@": "MathJax's speech engine (its menu is off: enableMenu)",
    "https://cdn.jsdelivr.net/npm/sre-mathmaps-ie@": "MathJax's speech engine (its menu is off: enableMenu)",
    "https://cdn.jsdelivr.net/npm/speech-rule-engine@": "MathJax's speech rules, which only its accessibility menu "
                                                        "turns on (the menu is off: enableMenu in mathjax.js)",
}
"""The loads, named in the site's scripts, that its pages never make, and why."""
CDN_HOSTS = {"unpkg.com", "cdn.jsdelivr.net", "cdnjs.cloudflare.com", "fonts.googleapis.com", "fonts.gstatic.com",
             "ajax.googleapis.com", "code.jquery.com", "esm.sh", "cdn.skypack.dev", "polyfill.io"}
LOADABLE = re.compile(r"\.(m?js|css|woff2?|ttf|otf|eot|png|jpe?g|gif|svg|webp|json|wasm)$", re.IGNORECASE)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The docs site, built once (30-60 s: every example on it runs)."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]'")
    pytest.importorskip("material", reason="mkdocs-material is not installed: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "-q", "-f", str(ROOT / "mkdocs.yml"),
                            "-d", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert build.returncode == 0, build.stderr[-4000:]
    return out


def test_site_pages_load_nothing_from_another_host(site):
    pages = sorted(site.rglob("*.html"))
    external, missing, hyperlinks, math = [], [], 0, 0
    for page in pages:
        refs = Refs(page.read_text(encoding="utf-8"))
        external += [f"{page.relative_to(site)}: {u[:120]}" for u in refs.loads if is_external(u)]
        external += [f"{page.relative_to(site)}: inline script {u}" for s in refs.scripts for u in HOST.findall(s)]
        here = "/" + page.relative_to(site).as_posix()
        for url in refs.loads:
            if is_external(url) or url.lower().startswith(("#", "data:", "blob:")):
                continue
            if not (site / urlsplit(urljoin(here, url)).path.lstrip("/")).is_file():
                missing.append(f"{page.relative_to(site)}: {url[:120]}")
        hyperlinks += sum(is_external(u) for u in refs.links)
        math += any(u.endswith("assets/vendor/mathjax/tex-svg-full.js") for u in refs.loads)
    assert external == [], "pages that load from another host:\n" + "\n".join(external)
    assert missing == [], "pages that load a file the site lacks:\n" + "\n".join(missing)
    assert math == len(pages), "every page loads the MathJax shipped with the site"
    assert hyperlinks > 0, "links to sources are kept, and allowed"


def test_site_stylesheets_load_nothing_from_another_host(site):
    external = [f"{css.relative_to(site)}: {u}" for css in sorted(site.rglob("*.css"))
                for u in css_urls(css.read_text(encoding="utf-8")) if is_external(u)]
    assert external == [], "\n".join(external)


def test_site_scripts_load_nothing_from_another_host(site):
    """A script's absolute URL of a file (a script, a style sheet, a font, an image, data) or on a CDN is one
    it may load: each must be a load the site never makes (``ON_DEMAND``). Links to source code on GitHub in
    the scripts' comments are not loads."""
    found = set()
    for js in sorted(site.rglob("*.js")):
        for url in re.findall(r"""https?://[^\s"'`<>()\\,;]+""", js.read_text(encoding="utf-8", errors="replace")):
            host, path = urlsplit(url).hostname or "", urlsplit(url).path
            if host != "github.com" and (host in CDN_HOSTS or LOADABLE.search(path)):
                found.add((js.relative_to(site).as_posix(), url))
    unexplained = sorted(f"{js}: {url}" for js, url in found if not url.startswith(tuple(ON_DEMAND)))
    assert unexplained == [], "scripts that may load from another host:\n" + "\n".join(unexplained)
    assert not any('class="mermaid"' in p.read_text(encoding="utf-8") for p in site.rglob("*.html")), \
        "a Mermaid diagram makes Material load Mermaid from unpkg.com: ship Mermaid first"


def test_mathjax_menu_that_could_fetch_the_speech_engine_is_off():
    # the allow-list above excuses MathJax's speech-engine URLs only because nothing can turn it on
    config = (ROOT / "docs" / "assets" / "mathjax.js").read_text(encoding="utf-8")
    assert re.search(r"enableMenu:\s*false", config)
