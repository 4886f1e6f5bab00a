"""MkDocs hooks for the pdplan site (``hooks:`` in mkdocs.yml).

- Put the repository root and this folder on ``sys.path``, so the executed code blocks import
  ``calculator``, ``api`` and the ``pdplan_docs`` helpers whether or not pdplan is installed.
- Find the committed microbenchmark reports, ``docs/validation/<name>/report.md``, at build time:
  list each under "Validation" in the navigation and summarise them on ``validation.md`` (their
  held-out error tables, their plots, links to the full reports). Written as Markdown before
  MkDocs converts the page, so every link and image is checked by ``mkdocs build --strict``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.dont_write_bytecode = True  # no __pycache__ inside docs/ from the helper imports
for p in (HERE, HERE.parent.parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import pdplan_docs

VALIDATION_PAGE = "validation.md"
PLACEHOLDER = "<!-- validation-reports -->"


def on_config(config, **_):
    pdplan_docs.set_docs_dir(Path(config["docs_dir"]))
    reports = pdplan_docs.validation_reports()
    if not reports or not config["nav"]:
        return config
    entries = [{"Overview": VALIDATION_PAGE}] + [{r.name: r.page} for r in reports]
    for i, item in enumerate(config["nav"]):
        if isinstance(item, dict) and item.get("Validation") == VALIDATION_PAGE:
            config["nav"][i] = {"Validation": entries}
    return config


def on_page_markdown(markdown: str, page, **_):
    if page.file.src_uri != VALIDATION_PAGE:
        return markdown
    return markdown.replace(PLACEHOLDER, pdplan_docs.validation_summary())
