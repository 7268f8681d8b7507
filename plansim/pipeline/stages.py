"""Which layers each pipeline stage runs.

Layers are split into ``pp * v`` contiguous chunks; chunk ``c`` runs on stage ``c % pp`` (Megatron-LM's interleaved
assignment; with v = 1 stage s simply owns the s-th contiguous block). When ``layers`` is not divisible by ``pp``
(v = 1 only), the first ``layers % pp`` stages take one extra layer, unless the strategy's ``layer_split`` says how
many each stage takes. The input embedding (layer -1) goes with stage 0,
the output layer (layer ``layers``) with the last stage.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["EMBEDDING_LAYER", "chunk_layers", "stage_layers"]

EMBEDDING_LAYER = -1


def chunk_layers(num_layers: int, pp: int, v: int = 1, split: Sequence[int] | None = None) -> list[list[int]]:
    """Layer indices per model chunk (``pp * v`` chunks in model order; chunk ``c`` runs on stage ``c % pp``),
    the embedding (-1) in chunk 0 and the output layer in the last chunk. ``split`` gives the blocks of each chunk
    (the strategy's ``layer_split``; ``check_strategy`` has checked it); by default they are even.

    >>> chunk_layers(4, 2, v=2)
    [[-1, 0], [1], [2], [3, 4]]
    >>> chunk_layers(5, 2, split=[3, 2])
    [[-1, 0, 1, 2], [3, 4, 5]]
    """
    chunks = pp * v
    base, extra = divmod(num_layers, chunks)
    sizes = list(split) if split is not None else [base + (1 if c < extra else 0) for c in range(chunks)]
    if len(sizes) != chunks or sum(sizes) != num_layers:
        raise ValueError(f"split {sizes}: needs {chunks} chunk sizes summing to {num_layers}")
    bounds = [0]
    for size in sizes:
        bounds.append(bounds[-1] + size)
    out = [list(range(bounds[c], bounds[c + 1])) for c in range(chunks)]
    out[0].insert(0, EMBEDDING_LAYER)
    out[-1].append(num_layers)
    return out


def stage_layers(num_layers: int, pp: int, v: int = 1, split: Sequence[int] | None = None) -> list[list[int]]:
    """Layer indices per stage, embedding (-1) first on stage 0 and the output layer last on the last stage.

    >>> stage_layers(4, 2)
    [[-1, 0, 1], [2, 3, 4]]
    >>> stage_layers(4, 2, v=2)
    [[-1, 0, 2], [1, 3, 4]]
    >>> stage_layers(5, 2)
    [[-1, 0, 1, 2], [3, 4, 5]]
    """
    stages: list[list[int]] = [[] for _ in range(pp)]
    for c, layers in enumerate(chunk_layers(num_layers, pp, v, split)):
        stages[c % pp].extend(layers)
    return stages
