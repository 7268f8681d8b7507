"""PyTorch's CUDA caching allocator: what it reserves for a tensor beyond the tensor's bytes (block rounding).

Mechanism (PyTorch ``c10/cuda/CUDACachingAllocator.cpp``, constants ``kMinBlockSize`` = 512 B, ``kSmallSize`` = 1 MiB,
``kSmallBuffer`` = 2 MiB, ``kLargeBuffer`` = 20 MiB, ``kMinLargeAlloc`` = 10 MiB, ``kRoundLarge`` = 2 MiB;
``round_size`` and ``get_allocation_size``):

- every request is rounded up to a multiple of 512 B;
- requests up to 1 MiB come from 2 MiB segments of the small pool, requests up to 10 MiB from 20 MiB segments of the
  large pool; both are split between requests, so such a tensor costs its 512-byte rounding;
- a request above 10 MiB gets a segment of its size rounded up to 2 MiB; the tail (under 2 MiB) stays reserved
  beside it, split off as a free block only a smaller request can reuse.

A training step allocates the same sizes every micro-batch and every step, so the segments a tensor got are reused by
its successors of the same size: at the peak, what is reserved beyond the live tensors is this rounding of each live
tensor (``reserved_bytes``). Fragmentation from lifetimes that interleave (a freed block too small for the next
request, segments that cannot be released while one block in them lives) comes on top and is not modelled; the
``expandable_segments`` setting and ``max_split_size_mb`` change it, not the rounding. The default settings are
modelled.
"""

from __future__ import annotations

__all__ = ["reserved_bytes"]

MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 1 << 20  # kSmallSize: the small pool's largest request
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: above this a request gets a segment of its own
ROUND_LARGE = 2 << 20  # kRoundLarge: such a segment is rounded up to 2 MiB


def _round_up(n: float, unit: int) -> float:
    return -(-n // unit) * unit


def reserved_bytes(n_bytes: float) -> float:
    """Bytes the caching allocator reserves for a tensor of ``n_bytes`` in steady state (see the module text).

    >>> reserved_bytes(1000), reserved_bytes(5 * 2**20 + 1) - 5 * 2**20, reserved_bytes(11 * 2**20 + 1) / 2**20
    (1024, 512, 12.0)
    >>> reserved_bytes(0)
    0
    """
    if n_bytes <= 0:
        return 0
    if n_bytes <= MIN_LARGE_ALLOC:
        return _round_up(n_bytes, MIN_BLOCK)
    return _round_up(n_bytes, ROUND_LARGE)
