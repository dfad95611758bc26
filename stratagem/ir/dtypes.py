"""Tensor element types that documents may name, and their sizes."""

from __future__ import annotations

import builtins
from enum import StrEnum


class DType(StrEnum):
    float64 = "float64"
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"
    float8 = "float8"
    int64 = "int64"
    int32 = "int32"
    int16 = "int16"
    int8 = "int8"
    uint8 = "uint8"
    bool = "bool"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_floating(self) -> builtins.bool:  # the member `bool` shadows the builtin in this body
        return self.value.startswith(("float", "bfloat"))


_ITEMSIZE = {
    DType.float64: 8,
    DType.float32: 4,
    DType.float16: 2,
    DType.bfloat16: 2,
    DType.float8: 1,
    DType.int64: 8,
    DType.int32: 4,
    DType.int16: 2,
    DType.int8: 1,
    DType.uint8: 1,
    DType.bool: 1,
}
