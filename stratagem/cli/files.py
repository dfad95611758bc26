"""The files commands read and write, checked so that a bad path is one line naming the option.

Outputs are checked before any work (a capture, a calibration, a job), so a typo in `-o` costs nothing,
and `replace_atomically` leaves an existing file as it was when writing fails halfway.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from stratagem.errors import StratagemError


def read_text(path: Path, option: str) -> str:
    """The file's UTF-8 text; a folder, an unreadable file or other bytes are errors naming `option`."""
    if path.is_dir():
        raise StratagemError(f"{option}: {path} is a directory, not a file")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise StratagemError(f"{option}: {path}: no such file") from None
    except OSError as error:
        raise StratagemError(f"{option}: {path}: cannot read it: {error.strerror or error}") from None
    return decode(data, f"{option}: {path}")


def decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise StratagemError(f"{where}: not UTF-8 text (byte {error.start}: {error.reason})") from None


def parse_json(text: str | bytes) -> Any:
    """`json.loads`, with nesting too deep for Python's parser reported as a JSONDecodeError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", text if isinstance(text, str) else "", 0) from None


def json_reason(error: json.JSONDecodeError) -> str:
    """The parser's reason without the "at" some of its messages end in ("Unterminated string starting at"),
    which Python completes with the position; callers add their own position after it."""
    return error.msg.removesuffix(" at")


def check_output(path: Path | None, option: str) -> None:
    """Refuse an output path that cannot be written: a folder, a missing folder, no permission."""
    if path is None:
        return
    if path.is_dir():
        raise StratagemError(f"{option}: {path} is a directory; name a file in it")
    folder = path.parent
    if not folder.is_dir():
        raise StratagemError(f"{option}: {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise StratagemError(f"{option}: {path}: permission denied")


def write_text(path: Path, text: str, option: str) -> None:
    check_output(path, option)
    try:
        path.write_text(text)
    except OSError as error:
        raise StratagemError(f"{option}: {path}: cannot write it: {error.strerror or error}") from None


@contextlib.contextmanager
def replace_atomically(path: Path, option: str) -> Iterator[TextIO]:
    """A stream whose content replaces `path` only when the block ends without an error."""
    check_output(path, option)
    partial = path.with_name(f".{path.name}.partial")
    try:
        with partial.open("w") as stream:
            yield stream
        os.replace(partial, path)
    except OSError as error:
        raise StratagemError(f"{option}: {path}: cannot write it: {error.strerror or error}") from None
    finally:
        partial.unlink(missing_ok=True)
