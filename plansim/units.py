"""Unit helpers. Everything inside plansim is SI (seconds, bytes, FLOPs, bytes/s); these convert at the edges."""

from __future__ import annotations

__all__ = ["DTYPE_BYTES", "GB", "GiB", "dtype_bytes"]

GB = 1e9
GiB = 2**30

#: Bytes per element of each training dtype.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element.

    >>> dtype_bytes("bf16")
    2
    """
    return DTYPE_BYTES[dtype]
