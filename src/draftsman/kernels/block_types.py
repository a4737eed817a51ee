"""The block-type numbers the native kernels take: GGML's (gguf.GGMLQuantizationType's
values, kept here so that loading a kernel does not import gguf, ~0.2 s; a test checks that
they agree) and the records kernel's own code for int8 rows (kquant_records.h)."""

from __future__ import annotations

from enum import IntEnum


class GGMLType(IntEnum):
    """The GGML block types the kernels read."""

    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14


I8_ROW = 1000  # not a GGML type: int8 rows with one float32 scale each (TYPE_I8_ROW)
