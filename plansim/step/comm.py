"""What one collective or point-to-point send of a step is: the description both engines price and the lowering
issues."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Comm"]


@dataclass(frozen=True, slots=True)
class Comm:
    """A collective (or a point-to-point send) of one task.

    ``collective``/``algorithm`` are keys of ``plansim.costs.collectives.COLLECTIVES``; ``n_bytes`` is its message
    size (see ``MESSAGE_SIZE``). ``group``: the mesh axis it runs along (``tp``, ``dp``, hybrid sharding's
    ``dp_shard`` and ``dp_replicate``: the rank's group on that axis, ``DeviceMesh.group``), ``pp`` (a send to the
    stage ``peer`` stages away, wrapping around: interleaving sends the last stage's output to stage 0), ``emb``
    (the first and last stage's ranks that hold the tied embeddings).
    ``kind`` files its bytes under the output contract's ``comm_bytes_per_gpu`` key. ``local`` is the node-local
    group size of a two-level collective (algorithms whose registry entry ``reads_local``). ``engine``: what moves
    its bytes, which says what it takes from compute beside it (``plansim.costs.interference.engine_load``): NCCL's
    kernels, or Transformer Engine's userbuffers (``copy_engine``: the GPU's copy engines; ``userbuffers``: SM
    kernels beside a GEMM that left them their SMs).
    """

    collective: str
    algorithm: str
    group: str
    n_bytes: float
    kind: str
    peer: int = 0
    local: int | None = None
    engine: Literal["nccl", "copy_engine", "userbuffers"] = "nccl"
