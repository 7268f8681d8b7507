"""What one collective or point-to-point send of a step is: the description both engines price and the lowering
issues, with whom it runs typed (``Peers``) so that an engine dispatches on the kind of peers, never on a name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Comm", "GroupEnds", "Peers", "Shift", "Standalone", "WholeGroup"]


@dataclass(frozen=True, slots=True)
class WholeGroup:
    """Every rank of the rank's group along ``Comm.axis`` (``DeviceMesh.group``): a collective of that axis."""


@dataclass(frozen=True, slots=True)
class Shift:
    """One send to the rank ``steps`` along ``Comm.axis``, wrapping around (``DeviceMesh.shift``): a pipeline send
    to the stage ``steps`` away (interleaving sends the last stage's output to stage 0). Only the sender takes part:
    the receiver waits for its end."""

    steps: int


@dataclass(frozen=True, slots=True)
class GroupEnds:
    """The first and last ranks of the rank's group along ``Comm.axis``, a pair over the link between the two: the
    tied embedding's copies on the first and last pipeline stages."""


@dataclass(frozen=True, slots=True)
class Standalone:
    """Ranks its caller gives, outside any strategy's mesh (``plansim.des.engine.simulate_collective``);
    ``Comm.axis`` then names no axis of theirs."""


#: With whom a ``Comm`` runs, by kind.
Peers = WholeGroup | Shift | GroupEnds | Standalone


@dataclass(frozen=True, slots=True)
class Comm:
    """A collective (or a point-to-point send) of one task.

    ``collective``/``algorithm`` are keys of ``plansim.costs.collectives.COLLECTIVES``; ``n_bytes`` is its message
    size (see ``MESSAGE_SIZE``). ``axis``: the mesh axis it runs along (``tp``, ``dp``, hybrid sharding's
    ``dp_shard`` and ``dp_replicate``, ``pp``: a name of ``plansim.strategy.mesh``'s axes), ``peers`` which of that
    axis' ranks: the rank's whole group (``WholeGroup``), one rank some steps away (``Shift``: a pipeline send),
    the group's two ends (``GroupEnds``: the tied embedding's copies), or ranks given outside the mesh
    (``Standalone``).
    ``kind`` files its bytes under the output contract's ``comm_bytes_per_gpu`` key. ``local`` is the node-local
    group size of a two-level collective (algorithms whose registry entry ``reads_local``). ``engine``: what moves
    its bytes, which says what it takes from compute beside it (``plansim.costs.interference.engine_load``): NCCL's
    kernels, or Transformer Engine's userbuffers (``copy_engine``: the GPU's copy engines; ``userbuffers``: SM
    kernels beside a GEMM that left them their SMs).
    """

    collective: str
    algorithm: str
    axis: str
    n_bytes: float
    kind: str
    peers: Peers = WholeGroup()
    local: int | None = None
    engine: Literal["nccl", "copy_engine", "userbuffers"] = "nccl"
