"""The TaskGraph: what one pipeline stage's ranks do during one training step, as ordered tasks on streams.

``plansim.des.lower`` builds it from (model, cluster, strategy); the discrete-event engine (``plansim.des``) runs it.
Every rank of a pipeline stage runs the same :class:`StageProgram` (tensor-parallel ranks in lockstep, data-parallel
replicas identical); collectives name the mesh axis they run on (``tp``, ``dp``, ``pp``) and with whom along it
(``plansim.step.comm.Peers``: the whole group, a send some stages away, or the group's two ends for the tied
embedding), and the engine asks the graph's ``DeviceMesh`` for the global ranks of that group.

Tasks of one stream run in list order, one at a time (a CUDA stream). A task also waits for its ``deps``: tasks of
the same stage on other streams, or of other stages (a pipeline receive waits for the sender's send).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from plansim.step.comm import Comm
from plansim.strategy.mesh import DeviceMesh

__all__ = ["NO_KERNEL", "STREAMS", "StageProgram", "Task", "TaskGraph"]

#: compute: kernels and the blocking tensor-parallel collectives; p2p: pipeline sends; dp: data-parallel and ZeRO
#: collectives (NCCL runs them on their own stream, overlapping compute); tp: tensor-parallel collectives launched
#: asynchronously beside a kernel (a linear layer's input re-gathered in backward under sequence parallelism).
STREAMS = ("compute", "p2p", "dp", "tp")
#: compute-stream categories that run no kernel: the wait for the job's slowest GPU, the idle time after a blocking
#: pipeline call until the host launches the next kernel (``plansim.step.p2p``), and offloading's waits for the host
#: link and the CPU (``plansim.step.offload``: ``offload``, ``cpu_optimizer``)
NO_KERNEL = frozenset({"sync_wait", "p2p_call", "offload", "cpu_optimizer"})


@dataclass(slots=True)
class Task:
    """One task on one stream of a stage.

    ``category`` says what it is: forward, backward, weight_grad, recompute, tp_comm, send, p2p_call (the device's
    idle time after a blocking pipeline call, ``plansim.step.p2p``), grad_reduce, param_gather, embedding_sync,
    optimizer, sync_wait (the wait for the job's slowest GPU), offload and cpu_optimizer (offloading's waits for the
    host link and the CPU). ``duration_s`` is the compute time from the cost model
    (0 for communication, whose time the network decides). ``wait_s``: a blocking collective's expected wait for its
    slowest member before it starts (``plansim.costs.stragglers``); ``host_s`` the part of ``duration_s`` the GPU
    waits for the host's kernel launches. ``alloc`` tensors ``(name, bytes, memory
    category)`` are allocated when it starts, ``free`` names released when it ends. ``deps`` are ``(stage, task
    index)``.
    """

    name: str
    stream: str
    category: str
    duration_s: float = 0.0
    comm: Comm | None = None
    deps: tuple[tuple[int, int], ...] = ()
    alloc: tuple[tuple[str, float, str], ...] = ()
    free: tuple[str, ...] = ()
    microbatch: int = -1
    wait_s: float = 0.0
    #: the part of ``duration_s`` the GPU waits for the host to launch the task's kernels (``Segment.host_wait_s``)
    host_s: float = 0.0


@dataclass
class StageProgram:
    """Every task of one pipeline stage, and the memory it holds for the whole step.

    ``static_memory`` (weights, gradients, optimizer states, workspace reserve, CUDA context, NCCL buffers) is live
    before the step starts and after it ends: the step must return to it. What the caching allocator reserves beyond
    an activation's bytes is a ``fragmentation`` allocation beside it (``plansim.step.memory.LayerMemory``).
    """

    stage: int
    tasks: list[Task] = field(default_factory=list)
    static_memory: dict[str, float] = field(default_factory=dict)
    params: float = 0.0
    #: with offloading, what the stage's ranks keep in host memory by category (``plansim.step.memory.host_states``)
    host_memory: dict[str, float] = field(default_factory=dict)

    def add(self, task: Task) -> int:
        """Append ``task``; returns its index."""
        self.tasks.append(task)
        return len(self.tasks) - 1


@dataclass
class TaskGraph:
    """The step as per-stage programs, plus the step's FLOP counts (for MFU and HFU)."""

    stages: list[StageProgram]
    mesh: DeviceMesh
    num_microbatches: int
    model_flops: float
    hardware_flops: float

    @property
    def tp(self) -> int:
        """Tensor-parallel degree (the mesh's ``tp`` axis)."""
        return self.mesh.size("tp")

    @property
    def dp(self) -> int:
        """Data-parallel degree (the mesh's ``dp`` axis)."""
        return self.mesh.size("dp")

    @property
    def pp(self) -> int:
        """Pipeline stages (the mesh's ``pp`` axis)."""
        return self.mesh.size("pp")

    @property
    def num_tasks(self) -> int:
        """Tasks over all stages (one rank each)."""
        return sum(len(s.tasks) for s in self.stages)
