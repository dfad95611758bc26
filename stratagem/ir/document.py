"""The base every IR document shares: strict parsing, a schema version and a content id.

The content id is the sha256 of the canonical JSON of the document without the fields that do not
change what the document *means* (its id and its provenance), so two services that receive the same
graph agree on its id and can deduplicate it. Fields at their default are left out of it, at every
depth: a field added later with a default leaves the id of every document written before it as it
was. A default is therefore part of the schema and never changes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from pathlib import Path
from typing import Any, ClassVar, Literal, Self, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from stratagem.errors import InvalidDocumentError, Problem

SCHEMA_VERSION = "1"


def canonical_json(data: Any) -> str:
    """JSON with sorted keys and no whitespace: the form that content ids are computed over."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def content_hash(content: Any) -> str:
    """A document's content id: sha256 hex of its canonical JSON."""
    return hashlib.sha256(canonical_json(content).encode()).hexdigest()


class Strict(BaseModel):
    """Sub-objects of documents: unknown fields are an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=False)


def problems_from_validation_error(error: ValidationError) -> list[Problem]:
    """Translate pydantic's error list into Problems with dotted/bracketed paths."""
    problems = []
    for item in error.errors(include_url=False):
        path = ""
        for part in item["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        message = str(item["msg"]).removeprefix("Value error, ")
        problems.append(Problem(path, message))
    return problems


class Document(Strict):
    """A top-level document: versioned, strictly validated, content-addressed."""

    _id_excluded: ClassVar[frozenset[str]] = frozenset({"id", "provenance"})
    _error_type: ClassVar[type[InvalidDocumentError]] = InvalidDocumentError

    schema_version: str = SCHEMA_VERSION
    """Version of the document schema; documents of another major version are refused."""
    id: str | None = None
    """Content id (sha256 hex of the canonical JSON without id and provenance); filled in on validation."""

    @model_validator(mode="after")
    def _check_version_and_id(self) -> Self:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version: {self.schema_version!r} is not supported (this library reads {SCHEMA_VERSION!r})"
            )
        try:
            expected = self.compute_id()
        except ValueError:  # json refuses inf and nan; say where they are
            content = self.model_dump(mode="python", exclude=set(self._id_excluded), exclude_defaults=True)
            raise ValueError(f"{_non_finite_path(content)}: must be a finite number") from None
        if self.id is not None and self.id != expected:
            raise ValueError(
                f"id: {self.id!r} does not match the content (expected {expected!r}); "
                "remove the id after editing a document"
            )
        object.__setattr__(self, "id", expected)
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        """Assigning a field the id covers re-derives the id; a refused assignment leaves the document as it was.

        Without this, pydantic stores the new value and only then finds the old id stale, leaving a
        document whose id lies about its content.
        """
        if name not in type(self).model_fields:
            super().__setattr__(name, value)
            return
        before = dict(self.__dict__)
        if name != "id" and name not in self._id_excluded:
            self.__dict__["id"] = None
        try:
            super().__setattr__(name, value)
        except ValidationError as error:
            object.__setattr__(self, "__dict__", before)
            raise self._error_type(problems_from_validation_error(error)) from None

    def compute_id(self) -> str:
        return content_hash(self.id_content())

    def id_content(self) -> dict[str, Any]:
        """What the content id covers: every field but the excluded ones, defaults left out, except the
        tag of a union member (a synchronizer's `kind`), which says what its other fields mean."""
        content = self.model_dump(mode="json", exclude=set(self._id_excluded), exclude_defaults=True)
        return _with_tags(self, content)

    def replace(self, **changes: Any) -> Self:
        """A validated copy with some fields changed (and a fresh id)."""
        data = self.model_dump(mode="json", exclude={"id"})
        for key, value in changes.items():
            data[key] = value.model_dump(mode="json") if isinstance(value, BaseModel) else value
        return type(self).parse(data)

    def to_json(self, *, indent: int | None = 2) -> str:
        return self.model_dump_json(indent=indent, exclude_none=False)

    @classmethod
    def parse(cls, data: dict[str, Any] | str | bytes) -> Self:
        """Validate a dict or JSON text, raising this document's InvalidDocumentError with field paths."""
        try:
            if isinstance(data, (str, bytes)):
                return cls.model_validate_json(data)
            return cls.model_validate(data)
        except ValidationError as error:
            other = cls._other_kind(data)
            if other is not None:
                raise cls._error_type([other]) from None
            raise cls._error_type(problems_from_validation_error(error)) from None

    @classmethod
    def _other_kind(cls, data: dict[str, Any] | str | bytes) -> Problem | None:
        """A whole document of another kind (a graph given where a strategy belongs, easy to do with
        three JSON files on the command line) gets one sentence naming both kinds, instead of a field
        error for every key of the wrong document."""
        if isinstance(data, (str, bytes)):
            try:
                data = json.loads(data)
            except (ValueError, RecursionError):
                return None
        if not isinstance(data, dict) or _has_required(cls, data):
            return None
        for other in _document_kinds():
            if other is not cls and _has_required(other, data):
                return Problem("", f"this is a {other.__name__} document, not a {cls.__name__}")
        return None

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """Bytes go to the JSON parser, so a file that is not UTF-8 is this document's error, not a UnicodeDecodeError."""
        return cls.parse(Path(path).read_bytes())

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")


def _with_tags(value: Any, content: Any) -> Any:
    """`content`, a defaults-excluded dump of `value`, with each union member's tag put back: a
    sharded synchronizer at its defaults and an all-reduce one at theirs would otherwise both dump as
    `{}` and share an id."""
    if isinstance(content, dict):
        if isinstance(value, BaseModel):
            for name, item in content.items():
                if isinstance(item, dict | list):
                    content[name] = _with_tags(getattr(value, name), item)
            for name, tag in _tags(type(value)):
                content.setdefault(name, tag)
        elif isinstance(value, dict):
            return {key: _with_tags(value[key], item) for key, item in content.items()}
    elif isinstance(content, list) and isinstance(value, list | tuple):
        return [_with_tags(v, c) for v, c in zip(value, content, strict=True)]
    return content


@functools.cache
def _tags(model: type[BaseModel]) -> tuple[tuple[str, Any], ...]:
    """The model's fields typed as one literal (a union member's tag), with that literal."""
    tags = []
    for name, field in model.model_fields.items():
        tag = get_args(field.annotation)
        if get_origin(field.annotation) is Literal and len(tag) == 1:
            tags.append((name, tag[0]))
    return tuple(tags)


def _document_kinds() -> list[type[Document]]:
    """Every concrete document class (ModelGraph, ResourceSpec, Strategy), found by subclassing."""
    found: list[type[Document]] = []
    pending = list(Document.__subclasses__())
    while pending:
        kind = pending.pop()
        found.append(kind)
        pending.extend(kind.__subclasses__())
    return found


def _has_required(kind: type[Document], data: dict[str, Any]) -> bool:
    """Whether `data` holds every field `kind` requires: the mark of a document of that kind."""
    required = [name for name, field in kind.model_fields.items() if field.is_required()]
    return bool(required) and all(name in data for name in required)


def _non_finite_path(value: Any, path: str = "") -> str:
    """Where the first inf or nan sits in dumped document data, as a field path."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _non_finite_path(
            item, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key)
        )
        if found:
            return found
    return ""


def check(problems: list[Problem], error_type: type[InvalidDocumentError]) -> None:
    """Raise error_type listing every problem, if there are any."""
    if problems:
        raise error_type(problems)


def as_value_error(problems: list[Problem]) -> None:
    """Inside a pydantic validator: report all problems at once, each with its path."""
    if problems:
        shown = "; ".join(str(p) for p in problems[:10])
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise ValueError(shown + more)
