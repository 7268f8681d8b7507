"""Unit helpers. Everything inside plansim is SI (seconds, bytes, FLOPs, bytes/s); these convert at the edges: bytes
per element of each training dtype (``dtype_bytes``), GB and GiB, and byte sizes as users write them
(``parse_bytes``)."""

from __future__ import annotations

import re

from plansim.errors import quoted

__all__ = ["DTYPE_BYTES", "GB", "GiB", "dtype_bytes", "parse_bytes"]

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


_BYTE_UNITS = {
    **{"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12},
    **{"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40},
}


def parse_bytes(value: str | float) -> float:
    """Bytes from a number or a string with a unit (``20GB``, ``1.5 GiB``, ``512MB``, ``4e9``); ValueError naming
    the accepted units otherwise.

    >>> parse_bytes("20GB"), parse_bytes("1 GiB"), parse_bytes(512)
    (20000000000.0, 1073741824.0, 512.0)
    """
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _BYTE_UNITS:
        raise ValueError(
            f"{quoted(value)} is not a size: write a number of bytes or one with a unit such as 20GB or 16GiB"
        )
    return float(match.group(1)) * _BYTE_UNITS[unit]
