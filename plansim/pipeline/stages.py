"""Which layers each pipeline stage runs.

Layers are split into ``pp * v`` contiguous chunks; chunk ``c`` runs on stage ``c % pp`` (Megatron-LM's interleaved
assignment; with v = 1 stage s simply owns the s-th contiguous block). When ``layers`` is not divisible by ``pp``
(v = 1 only), the first ``layers % pp`` stages take one extra layer, unless the strategy's ``layer_split`` says how
many each chunk takes (``chunk_blocks``). The input embedding (layer -1) goes with stage 0's first chunk, the output
layer (layer ``layers``) with the last stage's last chunk.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

__all__ = ["EMBEDDING_LAYER", "chunk_blocks", "chunk_layers", "stage_layers", "uneven_chunks"]

EMBEDDING_LAYER = -1


def chunk_blocks(num_layers: int, pp: int, v: int = 1, split: Sequence[int] | None = None) -> list[int]:
    """Transformer blocks per model chunk (``pp * v`` chunks in model order; chunk ``c`` runs on stage ``c % pp``).

    ``split`` is the strategy's ``layer_split`` (``check_strategy`` has checked it): ``pp * v`` entries, one per
    chunk in model order (Megatron-LM's ``--pipeline-model-parallel-layout``, whose entry ``i = vpp_rank * pp +
    pp_rank`` is a chunk, ``megatron/core/transformer/pipeline_parallel_layer_layout.py:37-51`` at core_v0.15.0;
    torchtitan's ``module_fqns_per_model_part``, ``torchtitan/config/job_config.py:367-375`` at v0.2.2), or, with
    ``v > 1``, ``pp`` entries, each stage's blocks spread evenly over its ``v`` chunks (Megatron-LM's
    ``--decoder-first/last-pipeline-num-layers`` under virtual stages: each a multiple of v,
    ``megatron/core/transformer/transformer_config.py:1095-1106, 1114-1125`` there). By default the chunks are
    even, the first ``num_layers % (pp * v)`` one more.

    >>> chunk_blocks(8, 2, v=2)
    [2, 2, 2, 2]
    >>> chunk_blocks(8, 2, v=2, split=[1, 2, 2, 3])
    [1, 2, 2, 3]
    >>> chunk_blocks(12, 2, v=2, split=[4, 8])  # per stage: stage 0's 4 blocks over chunks 0 and 2
    [2, 4, 2, 4]
    """
    chunks = pp * v
    if split is not None and v > 1 and len(split) == pp:
        split = [split[c % pp] // v for c in range(chunks)]
    if split is None:
        base, extra = divmod(num_layers, chunks)
        return [base + (1 if c < extra else 0) for c in range(chunks)]
    sizes = list(split)
    if len(sizes) != chunks or sum(sizes) != num_layers:
        raise ValueError(f"split {sizes}: needs {chunks} chunk sizes summing to {num_layers}")
    return sizes


def uneven_chunks(num_layers: int, pp: int, v: int, split: Sequence[int] | None) -> bool:
    """Whether ``split`` gives a stage's model chunks (``v > 1``) different block counts, which the schedules' closed
    forms (each stage's mean chunk) do not time exactly.

    >>> uneven_chunks(24, 4, 2, [3] * 8), uneven_chunks(24, 4, 2, [2, 3, 3, 3, 3, 3, 3, 4])
    (False, True)
    """
    return v > 1 and split is not None and len(set(chunk_blocks(num_layers, pp, v, split))) > 1


def chunk_layers(num_layers: int, pp: int, v: int = 1, split: Sequence[int] | None = None) -> list[list[int]]:
    """Layer indices per model chunk (``pp * v`` chunks in model order; chunk ``c`` runs on stage ``c % pp``),
    the embedding (-1) in chunk 0 and the output layer in the last chunk; ``chunk_blocks`` gives each chunk's
    blocks (even by default, or the strategy's ``layer_split``).

    >>> chunk_layers(4, 2, v=2)
    [[-1, 0], [1], [2], [3, 4]]
    >>> chunk_layers(5, 2, split=[3, 2])
    [[-1, 0, 1, 2], [3, 4, 5]]
    >>> chunk_layers(6, 2, v=2, split=[1, 2, 2, 1])
    [[-1, 0], [1, 2], [3, 4], [5, 6]]
    """
    bounds = [0]
    for size in chunk_blocks(num_layers, pp, v, split):
        bounds.append(bounds[-1] + size)
    out = [list(range(a, b)) for a, b in itertools.pairwise(bounds)]
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
