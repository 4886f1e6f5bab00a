"""Tables for the command line that fit the terminal: ids and numbers never wrap or lose a
character; when the console is too narrow for every column, the least important columns go first.

The console is ``$COLUMNS`` wide when that is set (also into a pipe: ``COLUMNS=80 pdplan plan … |
cat``), else the terminal's width, else ``PIPE_WIDTH`` (a pipe or a file: wide enough for every column).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from rich import box
from rich.cells import cell_len
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

PIPE_WIDTH = 160
"""Columns when stdout is not a terminal and ``$COLUMNS`` is not set."""
GAP = 2
"""Characters between two columns (no outer border)."""
SHORT_MIN = 12
"""Narrowest a shortened or wrapped text column gets."""


def console_width() -> int | None:
    """``$COLUMNS``, else None on a terminal (rich asks it), else ``PIPE_WIDTH``."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return None if sys.stdout.isatty() else PIPE_WIDTH


def stdout_console() -> Console:
    """A console on the current ``sys.stdout`` (resolved at print time, so a test's capture works)."""
    return Console(width=console_width(), emoji=False)  # user text such as "my:x:model" stays as typed


@dataclass(frozen=True)
class Column:
    """One column: ``drop`` orders what goes on a narrow console (0: never, higher: sooner);
    ``text`` columns are free text, shortened with '…' (``wrap``: wrapped onto more lines) to fit."""

    header: str
    drop: int = 0
    left: bool = False
    text: bool = False
    wrap: bool = False


def _widest(cells: list[str]) -> int:
    return max((cell_len(c) for c in cells), default=0)


def fit_table(title: str | None, columns: list[Column], rows: list[list[str]], width: int) -> Table:
    """A table of ``rows`` (plain strings, one per column) at most ``width`` characters wide.

    Each column needs its widest cell (an id, a number) or, for text, ``SHORT_MIN``; a header wraps
    at its spaces. Columns are dropped, highest ``drop`` first (the rightmost among equals), until
    the needs fit; the space left widens text and headers, the most important columns first. When
    even the ``drop == 0`` columns do not fit, long cells fold onto more lines, whole.
    """
    keep = list(range(len(columns)))
    natural = [max(_widest([r[i] for r in rows]), cell_len(c.header)) for i, c in enumerate(columns)]
    least = [max(max((cell_len(w) for w in c.header.split()), default=0),
                 min(natural[i], SHORT_MIN) if c.text else _widest([r[i] for r in rows]))
             for i, c in enumerate(columns)]

    def need(cols: list[int]) -> int:
        return sum(least[i] for i in cols) + GAP * (len(cols) - 1)

    while need(keep) > width and any(columns[i].drop for i in keep):
        keep.remove(max((i for i in keep if columns[i].drop), key=lambda i: (columns[i].drop, i)))
    fits = need(keep) <= width
    widths = {i: least[i] for i in keep}
    spare = width - need(keep)
    for i in sorted(keep, key=lambda i: (columns[i].drop, i)):
        grow = min(max(spare, 0), natural[i] - widths[i])
        widths[i] += grow
        spare -= grow

    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0),
                  title_justify="left")
    for i in keep:
        c = columns[i]
        table.add_column(Text(c.header), justify="left" if c.left else "right", width=widths[i] if fits else None,
                         overflow="fold")
    for r in rows:
        table.add_row(*(Text(r[i], no_wrap=fits and not columns[i].wrap,
                             overflow="ellipsis" if columns[i].text and not columns[i].wrap else "fold") for i in keep))
    return table


def pairs_table(title: str, rows: list[tuple[str, str]]) -> Group:
    """A title line over two columns, name and value; long values and the title wrap, names never do."""
    table = Table(show_header=False, box=box.SIMPLE, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    table.add_column("name", no_wrap=True)
    table.add_column("value", overflow="fold")
    for name, value in rows:
        table.add_row(Text(name), Text.from_markup(value) if "[/]" in value else Text(value))
    return Group(Text(title), table) if title else Group(table)
