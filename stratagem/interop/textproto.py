"""A small reader and writer for protobuf's text format, enough for AutoDist's strategy messages.

Stratagem does not depend on `protobuf`: the text format is simple, and reading it ourselves lets
errors name the line. The reader yields an untyped tree (field names, scalars, nested messages);
giving it meaning (field types, defaults, unknown fields) is the caller's job.

Accepted: `name: value`, `name { ... }` and `name < ... >` (with or without a colon), `name: [a, b]`
lists, `#` comments, optional `,`/`;` after a field, single- or double-quoted strings with C escapes
(adjacent strings concatenate), decimal/hex/float numbers, and identifiers (enum names, booleans).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

ScalarKind = Literal["string", "number", "ident"]


@dataclass(frozen=True)
class Scalar:
    kind: ScalarKind
    value: str | int | float
    """The decoded string, the number, or the identifier's text."""
    line: int


@dataclass(frozen=True)
class Message:
    fields: list[TextField] = field(default_factory=list)
    line: int = 1


@dataclass(frozen=True)
class TextField:
    name: str
    value: Scalar | Message
    line: int


@dataclass(frozen=True)
class Enum:
    """An enum value to write bare (`spec: RING`), not quoted."""

    name: str


WriteValue = str | int | float | bool | Enum | list[tuple[str, "WriteValue"]]


class TextFormatError(ValueError):
    def __init__(self, line: int, column: int, reason: str) -> None:
        super().__init__(f"line {line}, column {column}: {reason}")
        self.line, self.column, self.reason = line, column, reason


_TOKEN = re.compile(
    r"""(?P<space>[ \t\r\n]+|\#[^\n]*)
      | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
      | (?P<number>-?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)[fF]?)
      | (?P<ident>-?[A-Za-z_][A-Za-z0-9_]*)
      | (?P<punct>[{}<>:\[\],;])
      | (?P<error>.)""",
    re.VERBOSE | re.DOTALL,
)


class _Token(NamedTuple):
    kind: str
    text: str
    line: int
    column: int


def _tokenize(text: str) -> list[_Token]:
    line_starts = [0] + [newline.end() for newline in re.finditer("\n", text)]
    tokens = []
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup or ""
        if kind == "space":
            continue
        line = bisect.bisect_right(line_starts, match.start())
        column = match.start() - line_starts[line - 1] + 1
        if kind == "error":
            raise TextFormatError(line, column, f"unexpected character {match.group()!r}")
        tokens.append(_Token(kind, match.group(), line, column))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.index = 0

    def peek(self) -> _Token | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self) -> _Token:
        token = self.peek()
        if token is None:
            last = self.tokens[-1] if self.tokens else _Token("", "", 1, 0)
            raise TextFormatError(last.line, last.column + len(last.text), "unexpected end of text")
        self.index += 1
        return token

    def expect(self, text: str) -> _Token:
        token = self.take()
        if token.text != text:
            raise TextFormatError(token.line, token.column, f"expected {text!r}, found {token.text!r}")
        return token

    def message(self, closer: str | None, line: int) -> Message:
        fields: list[TextField] = []
        while True:
            token = self.peek()
            if token is None:
                if closer is None:
                    return Message(fields, line)
                self.take()
            elif closer is not None and token.text == closer:
                self.take()
                return Message(fields, line)
            else:
                fields.extend(self.field())

    def field(self) -> list[TextField]:
        name = self.take()
        if name.kind != "ident" or name.text.startswith("-"):
            raise TextFormatError(name.line, name.column, f"expected a field name, found {name.text!r}")
        token = self.peek()
        has_colon = token is not None and token.text == ":"
        if has_colon:
            self.take()
        token = self.peek()
        if token is not None and token.text == "[" and has_colon:
            values = self.list_values()
        elif token is not None and token.text in "{<":
            values = [self.submessage()]
        elif has_colon:
            values = [self.scalar()]
        else:
            found = token.text if token else "end of text"
            raise TextFormatError(name.line, name.column, f"expected ':' or '{{' after {name.text!r}, found {found!r}")
        separator = self.peek()
        if separator is not None and separator.text in ",;":
            self.take()
        return [TextField(name.text, value, name.line) for value in values]

    def list_values(self) -> list[Scalar | Message]:
        self.expect("[")
        values: list[Scalar | Message] = []
        while True:
            token = self.peek()
            if token is not None and token.text == "]" and not values:
                self.take()
                return values
            values.append(self.submessage() if token is not None and token.text in "{<" else self.scalar())
            end = self.take()
            if end.text == "]":
                return values
            if end.text != ",":
                raise TextFormatError(end.line, end.column, f"expected ',' or ']' in a list, found {end.text!r}")

    def submessage(self) -> Message:
        opener = self.take()
        return self.message("}" if opener.text == "{" else ">", opener.line)

    def scalar(self) -> Scalar:
        token = self.take()
        if token.kind == "string":
            data = bytearray(_unescape(token))
            while (following := self.peek()) is not None and following.kind == "string":
                data += _unescape(self.take())
            try:
                return Scalar("string", data.decode("utf-8"), token.line)
            except UnicodeDecodeError:
                raise TextFormatError(token.line, token.column, "string is not valid UTF-8") from None
        if token.kind == "number":
            return Scalar("number", _number(token), token.line)
        if token.kind == "ident":
            return Scalar("ident", token.text, token.line)
        raise TextFormatError(token.line, token.column, f"expected a value, found {token.text!r}")


def _number(token: _Token) -> int | float:
    text = token.text.rstrip("fF") if not token.text.lower().startswith(("0x", "-0x")) else token.text
    try:
        if re.fullmatch(r"-?0[xX][0-9a-fA-F]+", text):
            return int(text, 16)
        if re.fullmatch(r"-?\d+", text):
            return int(text)
        return float(text)
    except ValueError:
        raise TextFormatError(token.line, token.column, f"not a number: {token.text!r}") from None


_SIMPLE_ESCAPES = {"n": 10, "r": 13, "t": 9, '"': 34, "'": 39, "\\": 92, "a": 7, "b": 8, "f": 12, "v": 11, "?": 63}


def _unescape(token: _Token) -> bytes:
    body, out, i = token.text[1:-1], bytearray(), 0
    if "\\" not in body:
        return body.encode("utf-8")
    while i < len(body):
        char = body[i]
        if char != "\\":
            out += char.encode("utf-8")
            i += 1
            continue
        code = body[i + 1]
        if code in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[code])
            i += 2
        elif code in "01234567":
            digits = re.match(r"[0-7]{1,3}", body[i + 1 :]).group()  # type: ignore[union-attr]
            out.append(int(digits, 8) & 0xFF)
            i += 1 + len(digits)
        elif code in "xX" and (hexa := re.match(r"[0-9a-fA-F]{1,2}", body[i + 2 :])):
            out.append(int(hexa.group(), 16))
            i += 2 + len(hexa.group())
        elif code in "uU" and (uni := re.match(r"[0-9a-fA-F]{4}" if code == "u" else r"[0-9a-fA-F]{8}", body[i + 2 :])):
            out += chr(int(uni.group(), 16)).encode("utf-8")
            i += 2 + len(uni.group())
        else:
            raise TextFormatError(token.line, token.column, f"unknown escape '\\{code}' in a string")
    return bytes(out)


def parse(text: str) -> Message:
    """The tree of a text-format message; raises TextFormatError naming the line and column."""
    return _Parser(text).message(None, 1)


def _escape(text: str) -> str:
    """protobuf's CEscape: printable ASCII as is, the usual escapes, other bytes (UTF-8) as octal."""
    out = []
    for byte in text.encode("utf-8"):
        char = chr(byte)
        if char in "\"'\\":
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif 0x20 <= byte < 0x7F:
            out.append(char)
        else:
            out.append(f"\\{byte:03o}")
    return "".join(out)


def _format_scalar(value: str | int | float | bool | Enum) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, str):
        return f'"{_escape(value)}"'
    return repr(value)


def render(fields: list[tuple[str, WriteValue]], indent: int = 0) -> str:
    """Text format as protobuf's Python `str(message)` writes it: two-space indent, one field a line."""
    pad = "  " * indent
    lines = []
    for name, value in fields:
        if isinstance(value, list):
            lines.append(f"{pad}{name} {{\n{render(value, indent + 1)}{pad}}}\n")
        else:
            lines.append(f"{pad}{name}: {_format_scalar(value)}\n")
    return "".join(lines)
