"""Reading a user's file safely: a regular file only (never a FIFO, device or socket, which could
block or never end), bounded in size, UTF-8 text (a byte-order mark is accepted), and every
failure an ``InputError`` naming the file and the argument it came from."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import InputError


def read_text_file(path: str | os.PathLike[str], field: str, max_bytes: int) -> str:
    """The text of ``path`` (at most ``max_bytes``), or ``InputError(field, ...)`` saying why not."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise InputError(field, f"{p}: no such file") from None
    except OSError as e:
        raise InputError(field, f"{p}: cannot read ({e.strerror or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(field, f"{p}: is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(field, f"{p}: not a regular file (a pipe, device or socket is not read)")
    if st.st_size > max_bytes:
        raise InputError(field, f"{p}: {st.st_size:,} bytes, more than the {max_bytes:,} allowed")
    try:
        with open(p, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as e:
        raise InputError(field, f"{p}: cannot read ({e.strerror or e})") from None
    if len(data) > max_bytes:
        raise InputError(field, f"{p}: more than the {max_bytes:,} bytes allowed")
    if b"\x00" in data:
        raise InputError(field, f"{p}: a binary file (it holds NUL bytes), not UTF-8 text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(field, f"{p}: not UTF-8 text (invalid byte at offset {e.start})") from None


def json_lines(text: str, name: str, field: str):  # type: ignore[no-untyped-def]
    """(line number, value) of each non-blank line of a JSON-lines text; a line that is not JSON is an
    ``InputError`` on ``field`` naming the file, the line and the column."""
    import json

    for i, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(field, f"{name}: line {i}, column {e.colno}: not JSON ({e.msg})") from None
        yield i, value


def yaml_document(text: str, name: str, field: str, what: str = "YAML"):  # type: ignore[no-untyped-def]
    """A user's YAML (or JSON) document, safely: plain data only (``yaml.SafeLoader``), and no aliases
    (``*name``). A few lines of nested aliases expand to billions of nodes in anything that walks the
    document (validation, hashing, an error message quoting it), so they are refused with the line,
    not followed. Any YAML error is an ``InputError`` on ``field`` naming the file."""
    import yaml

    class _NoAliases(yaml.SafeLoader):
        def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise InputError(field, f"{name}: line {mark.line + 1}, column {mark.column + 1}: YAML aliases "
                                        "(*name) are not read; write the value out")
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, Loader=_NoAliases)
    except yaml.YAMLError as e:
        raise InputError(field, f"{name} is not valid {what}: {e}") from None
