"""Framework profiles: how Megatron-LM, DeepSpeed and PyTorch FSDP run a strategy, as data (``frameworks/*.yaml``).

The same strategy runs differently in each framework: which ZeRO stages it implements and which of them combine with
pipelining, in which dtype it reduces gradients, whether the reduction overlaps backward, how it buckets gradients.
Each profile states these as rules, every rule with the framework's code it comes from (file, line, version), so
that a rule can be checked against its source and changed with it. ``Strategy.resolve`` takes a strategy's defaults
from its framework's rules and ``plansim.strategy.checks`` refuses what the framework cannot run, naming it.

Profiles are read once per file version (validated, frozen). ``framework_names()`` lists them, ``load_framework``
reads one; ``modelled_zero_stages`` is what the planner searches (the ZeRO stages a framework runs that plansim
models; ``unmodelled`` says why not), ``library_algorithms`` the all-reduces its communication library runs (its
``collective_library`` rule, each registry entry's ``Algorithm.library``), and its ``remat_policies`` rule the
recompute policies it runs (``plansim.costs.remat_policies`` names), which the planner searches. docs/frameworks.md
says where each rule is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from plansim.costs.remat_policies import REMAT_POLICIES
from plansim.errors import PlansimError, shown
from plansim.files.data import data_dir
from plansim.files.yamlfile import read_mapping, validated
from plansim.hardware.schema import Architecture, AttentionKernel

__all__ = [
    "RECIPE_ARCHITECTURES",
    "AttentionKernels",
    "ContextParallel",
    "Dispatcher",
    "ExpertParallel",
    "FP8Training",
    "FrameworkProfile",
    "FrameworkRules",
    "GradBucket",
    "KernelLaunch",
    "Offload",
    "OffloadForm",
    "ParamPrefetch",
    "PipelineSends",
    "Rule",
    "TPCommOverlap",
    "framework_names",
    "is_framework",
    "library_algorithms",
    "load_framework",
    "modelled_zero_stages",
    "rule_differences",
    "unmodelled",
]

T = TypeVar("T")
ZeroStage = Literal[0, 1, 2, 3]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Rule(_Strict, Generic[T]):
    """One behaviour of a framework: its ``value`` and the ``source`` it comes from (the framework's code: path,
    line and version; the profile's header names the version)."""

    value: T
    source: str = Field(min_length=20, description="the framework's code this rule comes from (path:line)")


class GradBucket(_Strict):
    """How a framework groups gradients into one reduction: a number of ``params`` (at least, or ``params_per_dp``
    times the data-parallel degree if more: Megatron-LM), of ``elements`` (DeepSpeed's ``reduce_bucket_size``) or of
    ``bytes`` (PyTorch DDP's ``bucket_cap_mb``)."""

    params: int | None = Field(default=None, ge=1)
    params_per_dp: int = Field(default=0, ge=0)
    elements: int | None = Field(default=None, ge=1)
    bytes: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _one_size(self) -> GradBucket:
        if sum(v is not None for v in (self.params, self.elements, self.bytes)) != 1:
            raise ValueError("give one of params (with params_per_dp), elements or bytes")
        return self

    def size_bytes(self, dp: int, grad_bytes: int) -> int:
        """The bucket's bytes at data-parallel degree ``dp`` with gradients of ``grad_bytes`` each.

        >>> GradBucket(params=40_000_000, params_per_dp=1_000_000).size_bytes(64, 4)  # Megatron-LM at dp 64
        256000000
        >>> GradBucket(elements=500_000_000).size_bytes(64, 2)
        1000000000
        """
        if self.bytes is not None:
            return self.bytes
        if self.elements is not None:
            return self.elements * grad_bytes
        assert self.params is not None
        return max(self.params, self.params_per_dp * dp) * grad_bytes


class TPCommOverlap(_Strict):
    """How a framework pipelines a transformer block's GEMMs with their tensor-parallel collectives (Megatron-LM's
    ``--tp-comm-overlap`` on Transformer Engine's userbuffers): each all-gather feeding a GEMM as a ring exchange of tp
    point-to-point steps, the GEMM computed chunk by chunk as they arrive (``ring_exchange``), and each row-parallel
    forward GEMM in ``reduce_scatter_splits`` chunks, each chunk reduce-scattered beside the next one's GEMM. The
    other collectives run in SM kernels of ``kernel_sms`` SMs beside GEMMs that leave them those SMs. Its
    communication buffers are ``buffers`` tensors of one micro-batch's whole activation each. It needs sequence
    parallelism (``needs_sequence_parallel``)."""

    ring_exchange: bool
    reduce_scatter_splits: int = Field(ge=2, le=64)
    kernel_sms: int = Field(ge=0, le=1024)
    buffers: int = Field(ge=0, le=64)
    #: the compute streams a split GEMM's chunks take in turn, so that each chunk's ramp-up and tail run beside its
    #: neighbours' work (1: one after another on one stream)
    gemm_streams: int = Field(default=1, ge=1, le=64)
    needs_sequence_parallel: bool


#: Each fused attention kernel as messages name it.
KERNEL_TITLES = {"flash2": "FlashAttention-2", "flash3": "FlashAttention-3", "cudnn": "cuDNN"}


class AttentionKernels(_Strict):
    """The fused attention kernel a framework calls, by GPU architecture (``hardware.schema.GPUSpec.architecture``):
    ``by_architecture`` where one differs, ``default`` for the rest (``kernel_for``). A strategy with ``attention:
    unfused`` calls none."""

    default: AttentionKernel
    by_architecture: dict[Architecture, AttentionKernel] = Field(default_factory=dict)

    def kernel_for(self, architecture: str | None) -> AttentionKernel:
        """The kernel on a GPU of ``architecture`` (None: not stated, the default)."""
        return self.by_architecture.get(architecture, self.default) if architecture else self.default  # type: ignore[call-overload]


class ParamPrefetch(_Strict):
    """How far ahead a framework all-gathers ZeRO-3's sharded layers (in forward and in backward, in the order each
    runs them): ``layers`` ahead (FSDP's units); or, with ``elements``, the layers ahead until their parameters (one
    rank's, after tensor parallelism) reach that many, the one crossing it included (Megatron-FSDP's window); or,
    with ``live``, while the current layer's and theirs stay within ``elements`` (DeepSpeed's
    ``stage3_max_live_parameters``). At least one layer ahead wherever one is left.

    >>> ParamPrefetch(layers=1).ahead([5.0, 5.0, 5.0], 0), ParamPrefetch(layers=1).ahead([5.0, 5.0, 5.0], 2)
    (1, 0)
    >>> ParamPrefetch(elements=8).ahead([5.0] * 5, 0), ParamPrefetch(elements=12, live=True).ahead([5.0] * 5, 0)
    (2, 1)
    """

    layers: int | None = Field(default=None, ge=1, le=10_000)
    elements: int | None = Field(default=None, ge=1)
    live: bool = False

    @model_validator(mode="after")
    def _one_depth(self) -> ParamPrefetch:
        if (self.layers is None) == (self.elements is None):
            raise ValueError("give one of layers or elements")
        if self.live and self.elements is None:
            raise ValueError("live needs elements")
        return self

    def windows(self, params: Sequence[float]) -> list[int]:
        """``ahead`` at every position of a pass whose layers hold ``params`` (in the order it runs them).

        >>> ParamPrefetch(elements=8).windows([5.0] * 4)
        [2, 2, 1, 0]
        """
        return [self.ahead(params, pos) for pos in range(len(params))]

    def ahead(self, params: Sequence[float], pos: int) -> int:
        """How many of the layers after ``pos`` (``params``: each layer's parameters, in the order the pass runs
        them) are gathered beside layer ``pos``'s own."""
        rest = len(params) - pos - 1
        if rest <= 0:
            return 0
        if self.layers is not None:
            return min(self.layers, rest)
        assert self.elements is not None
        held, k = (params[pos] if self.live else 0.0), 0
        for p in params[pos + 1 :]:
            if self.live and k >= 1 and held + p > self.elements:
                break
            held, k = held + p, k + 1
            if not self.live and held >= self.elements:
                break
        return max(1, k)


class KernelLaunch(_Strict):
    """How a framework's kernels reach the GPU: in ``eager`` PyTorch the host issues each kernel of the step one op
    at a time (Python, the dispatcher, the driver's launch), ``host_s`` of host time each, while the GPU runs the
    kernels issued before; when the host issues a run of kernels more slowly than the GPU runs them, the GPU waits
    (``plansim.step.layers``). The frameworks plansim knows run eager by default (none captures CUDA graphs or
    compiles unless asked), so ``eager`` is the one mode."""

    mode: Literal["eager"]
    host_s: float = Field(ge=0.0, le=1e-3)


class ContextParallel(_Strict):
    """How a framework runs context parallelism: the forms of its attention it runs (``algorithms``, the first its
    default: ``ring``, keys and values passed rank to rank beside the attention's steps; ``all_to_all``, heads and
    sequence swapped around the attention), empty where it runs none plansim models; and whether it combines it with
    Megatron-LM's sequence parallelism (``with_sequence_parallel``)."""

    algorithms: tuple[Literal["ring", "all_to_all"], ...]
    with_sequence_parallel: bool = True

    @property
    def default(self) -> str | None:
        """The form a strategy that names none runs (None: the framework runs no context parallelism)."""
        return self.algorithms[0] if self.algorithms else None


#: The expert layers' token dispatchers (how tokens reach the ranks of their experts and come back): ``allgather``
#: (every rank of the tp x ep group gathers all tokens and keeps its experts': Megatron-LM's
#: MoEAllGatherTokenDispatcher), ``alltoall`` (each token sent to its experts' ranks by an all-to-all over ep: NCCL's,
#: through torch.distributed), ``deepep`` (DeepEP's fused dispatch and combine kernels: Megatron-LM's ``flex``
#: dispatcher on its deepep backend, torchtitan's ``expert_parallel_comm_backend: deepep``).
Dispatcher = Literal["allgather", "alltoall", "deepep"]


class ExpertParallel(_Strict):
    """How a framework runs expert parallelism (``Strategy.ep``, ``Strategy.etp``; the mesh's ``EXPERT_AXES``):
    whether it splits the experts over ranks at all (``ep``); the tensor parallelism inside the experts it runs
    beside ep > 1 (``etp``: ``any`` degree whose product with ep divides the ranks regrouped, Megatron-LM's;
    ``tp_or_1``, torchtitan's; ``tp``, DeepSpeed's, whose expert groups keep the tensor-parallel ranks whole), and its
    default there
    (``etp_default``: the attention's ``tp``, or 1); without ep every framework's experts take the tensor-parallel
    ranks, and only one that runs ``any`` lets etp differ; whether the expert axes may fold over context-parallel ranks
    (``with_cp``); its token dispatchers, its default first (``dispatchers``, ``Dispatcher``); whether a mixture-of-
    experts model with tp > 1 trains only with sequence parallelism (``needs_sequence_parallel``)."""

    ep: bool
    etp: Literal["any", "tp_or_1", "tp"]
    etp_default: Literal["tp", 1]
    with_cp: bool
    dispatchers: tuple[Dispatcher, ...] = Field(min_length=1)
    needs_sequence_parallel: bool = False

    def default_etp(self, tp: int, ep: int) -> int:
        """The expert tensor parallelism of a strategy that names none: with ep > 1 the rule's ``etp_default``, else
        the attention's ``tp``."""
        return 1 if ep > 1 and self.etp_default == 1 else tp

    def etp_values(self, tp: int, ep: int) -> tuple[int, ...] | None:
        """The expert tensor-parallel degrees it runs beside ``tp`` and ``ep`` (None: any whose product with ep
        divides the ranks the expert axes regroup).

        >>> rule = ExpertParallel(ep=True, etp="tp_or_1", etp_default=1, with_cp=True, dispatchers=("alltoall",))
        >>> rule.etp_values(4, 2), rule.etp_values(4, 1)
        ((4, 1), (4,))
        """
        if self.etp == "any":
            return None
        return (tp, 1) if self.etp == "tp_or_1" and ep > 1 and tp > 1 else (tp,)

    @property
    def dispatcher(self) -> Dispatcher:
        """Its default token dispatcher."""
        return self.dispatchers[0]


class FP8Training(_Strict):
    """How a framework trains in FP8 (``dtype: fp8``): the scaling recipes it runs (``recipes``, as
    ``plansim.strategy.schema.FP8_RECIPES`` names them; empty where it runs no FP8 GEMMs in training), its default
    first; the recipes under which it can keep and all-gather the sharded weights in FP8 (``param_gather``,
    ``Strategy.fp8_param_gather``) and whether it does so by default. Which GPU architectures run each recipe is
    Transformer Engine's (``RECIPE_ARCHITECTURES``)."""

    recipes: tuple[Literal["delayed", "current", "block", "mxfp8"], ...]
    param_gather: tuple[Literal["delayed", "current", "block", "mxfp8"], ...] = ()
    param_gather_default: bool = False
    #: whether the FP8 copy of each weight is cast once per step and reused by the later micro-batches (Transformer
    #: Engine's weight cache under ``is_first_microbatch``), else cast at every forward
    weight_cast_once_per_step: bool = False
    #: delayed scaling's amax history per tensor (Transformer Engine's DelayedScaling default 1024,
    #: transformer_engine/common/recipe/__init__.py:255 at d0067d0d, unless the framework sets it)
    amax_history_len: int = Field(default=1024, ge=1, le=1_000_000)

    @property
    def default(self) -> str | None:
        """The recipe a strategy that names none runs (None: the framework trains in no FP8)."""
        return self.recipes[0] if self.recipes else None


#: The GPU architectures that run each FP8 recipe's GEMMs (Transformer Engine's checks, transformer_engine/pytorch/
#: quantization.py:148-186 at NVIDIA/TransformerEngine d0067d0d): per-tensor FP8 (delayed, current) from compute
#: capability 8.9 (Ada, Hopper, Blackwell); block scaling from 9.0 with CUDA 12.9 (Hopper, Blackwell); MXFP8 on 10.x
#: only (Blackwell; "not supported on 12.0+ architectures yet").
RECIPE_ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "delayed": ("ada", "hopper", "blackwell"),
    "current": ("ada", "hopper", "blackwell"),
    "block": ("hopper", "blackwell"),
    "mxfp8": ("blackwell",),
}


class PipelineSends(_Strict):
    """How a framework synchronises a pipeline stage's sends: under the schedules named in ``blocking`` the sender's
    compute waits for each send's transfer (a blocking call, or a batch waited for before the next pass); with
    ``host_sync`` each such call also ends in ``torch.cuda.synchronize()``, so the device idles for the next kernel's
    launch. Under the other schedules a send runs beside the stage's compute and only its receiver waits for it."""

    blocking: tuple[str, ...]
    host_sync: bool


class OffloadForm(_Strict):
    """One combination of what a framework offloads to host memory (``kinds``, as ``Strategy.offload`` names them)
    and the ZeRO stages it runs it under."""

    kinds: tuple[Literal["optimizer", "params", "activations"], ...] = Field(min_length=1)
    zero: list[ZeroStage] = Field(min_length=1)


class Offload(_Strict):
    """How a framework offloads to host memory (``plansim.step.offload``): the combinations it runs (``forms``;
    empty: none); whether the reduced gradient shard then lives in host memory, off the GPU (``grads_on_host``;
    else the GPU keeps its gradients and a host copy is made for the CPU's step); whether the gradients' copy to
    the host runs beside backward, bucket by bucket (``grads_copied_in_backward``; else after backward, before the
    CPU's step); and, where it offloads activations, whether it does so beside pipelining and beside
    recomputation."""

    forms: tuple[OffloadForm, ...] = ()
    grads_on_host: bool = False
    grads_copied_in_backward: bool = False
    activations_with_pipeline: bool = False
    activations_with_remat: bool = False

    def zero_stages(self, kinds: tuple[str, ...]) -> list[int]:
        """The ZeRO stages under which it offloads exactly ``kinds`` (empty: it does not)."""
        return next((list(f.zero) for f in self.forms if set(f.kinds) == set(kinds)), [])


class FrameworkRules(_Strict):
    """The behaviours plansim reads from a framework (docs/frameworks.md says where each is used)."""

    zero_stages: Rule[list[ZeroStage]]
    zero_with_pipeline: Rule[list[ZeroStage]]
    grad_reduce_fp32: Rule[bool]
    grad_reduce_overlap: Rule[bool]
    grad_reduce_overlap_with_pipeline: Rule[bool]
    grad_bucket: Rule[GradBucket]
    sharded_grads_reduced_every_microbatch: Rule[bool]
    param_gather_overlap: Rule[bool]
    grad_buckets_first_chunk_only: Rule[bool]
    schedules: Rule[tuple[str, ...]]
    tp_grad_input_overlap: Rule[tuple[Literal["all_reduce", "reduce_scatter"], ...]]
    zero2_shards_weights: Rule[bool]
    #: the ZeRO stages at which the sharded parameters are the fp32 master weights (FSDP2 keeps each shard in the
    #: model's dtype and gathers a bf16 copy per unit): the optimizer holds no master copy of its own
    sharded_params_are_master: Rule[list[ZeroStage]]
    #: the ZeRO stages at which each unit's gradients are copied after its backward into a flat buffer in the reduce
    #: dtype of the unit's unsharded size, held until the next unit's reduce (FSDP2's foreach_reduce)
    grad_reduce_copy_in: Rule[list[ZeroStage]]
    sharded_weights_kept_with_pipeline: Rule[bool]
    tp_comm_overlap: Rule[TPCommOverlap | None]
    hybrid_shard: Rule[list[ZeroStage]]
    pipeline_sends: Rule[PipelineSends]
    param_prefetch: Rule[ParamPrefetch]
    attention_kernel: Rule[AttentionKernels]
    #: how the host issues the step's kernels, and its time per kernel
    kernel_launch: Rule[KernelLaunch]
    #: whether the optimizer step clips the gradients by their global norm (a norm pass and a scaling pass over the
    #: gradients it steps)
    grad_clip: Rule[bool]
    #: the communication library its collectives run in (all three: NCCL, through torch.distributed); the planner
    #: searches only the algorithms whose registry entry that library runs (``library_algorithms``)
    collective_library: Rule[Literal["nccl"]]
    #: the remat policies it runs, as ``plansim.costs.remat_policies.REMAT_POLICIES`` names them (none of them
    #: ``scheduled``: ``milp`` is plansim's own): what the planner searches under it (``planner.space``)
    remat_policies: Rule[tuple[str, ...]]
    #: the forms of context parallelism it runs (``cp_algorithm``), its default first
    context_parallel: Rule[ContextParallel]
    #: what it offloads to host memory, under which ZeRO stages, and how (``Strategy.offload``)
    offload: Rule[Offload]
    #: whether a strategy may place the blocks over the pipeline stages itself (``Strategy.layer_split``; else the
    #: framework's own partition runs, the even split)
    layer_split: Rule[bool]
    #: whether and how it trains in FP8 (``dtype: fp8``): its recipes, its default, FP8 parameter all-gather
    fp8: Rule[FP8Training]
    #: whether and how it runs expert parallelism (``ep``, ``etp``): the expert tensor parallelism it runs and its
    #: default, context parallelism beside it, its token dispatchers
    expert_parallel: Rule[ExpertParallel]

    @model_validator(mode="after")
    def _registered_policies(self) -> FrameworkRules:
        policies = self.remat_policies.value
        wrong = [p for p in policies if p not in REMAT_POLICIES or REMAT_POLICIES[p].scheduled]
        if wrong or not policies or len(set(policies)) != len(policies):
            raise ValueError(
                f"remat_policies {wrong or list(policies)}: name each policy it runs once, among "
                f"{', '.join(p for p, e in REMAT_POLICIES.items() if not e.scheduled)}"
            )
        return self


class FrameworkProfile(_Strict):
    """A framework's profile: its ``name`` (the file's stem, the strategy's ``framework``), the ``title`` messages
    use, the ``version`` its rules were read at, and the ``rules``."""

    name: str
    title: str
    version: str = Field(min_length=3)
    rules: FrameworkRules


@lru_cache(maxsize=1)
def _directory() -> Path:
    return data_dir("frameworks")


@lru_cache(maxsize=1)
def _names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in _directory().glob("*.yaml")))


def framework_names() -> list[str]:
    """The frameworks with a profile, sorted (the directory is listed once per process: strategies are validated
    by the thousand in a planner run).

    >>> framework_names()
    ['deepspeed', 'fsdp', 'megatron']
    """
    return list(_names())


def is_framework(name: object) -> bool:
    """Whether ``name`` names a framework profile (cheap: strategies are validated by the thousand)."""
    return name in _names()


def load_framework(name: str) -> FrameworkProfile:
    """The profile of framework ``name``, read and validated once per process.

    Raises
    ------
    PlansimError
        No profile of that name (the message lists the known ones), or the file breaks the schema.
    """
    if name not in _names():
        raise PlansimError(f"framework '{shown(name)}' is unknown: choose one of {', '.join(_names())}")
    return _load(name)


@lru_cache(maxsize=16)
def _load(name: str) -> FrameworkProfile:
    path = _directory() / f"{name}.yaml"
    profile = validated(FrameworkProfile, read_mapping(path, "framework profile"), path.name)
    if profile.name != name:
        raise PlansimError(f"framework profile {path.name}: name '{shown(profile.name)}' must be its file's stem")
    return profile


def unmodelled(name: str, zero: int, pp: int) -> str | None:
    """Why plansim does not model ZeRO stage ``zero`` at ``pp`` pipeline stages under framework ``name``, though the
    framework runs it; None where it does. (What the framework itself cannot run is its rules' business.)"""
    if pp > 1 and zero >= 2:
        if zero == 3 and load_framework(name).rules.sharded_weights_kept_with_pipeline.value:
            return None
        if zero == 2 and load_framework(name).rules.sharded_weights_kept_with_pipeline.value:
            return "with pipelining its ZeRO-2 keeps the weights gathered through the step as its ZeRO-3 does"
        return "plansim does not model ZeRO-2/3 with pipelining yet"
    return None


@lru_cache(maxsize=64)
def _modelled(name: str, pipelined: bool) -> tuple[int, ...]:
    rules = load_framework(name).rules
    stages = rules.zero_with_pipeline.value if pipelined else rules.zero_stages.value
    return tuple(z for z in stages if unmodelled(name, z, 2 if pipelined else 1) is None)


def modelled_zero_stages(name: str, pp: int) -> list[int]:
    """The ZeRO stages framework ``name`` runs at ``pp`` pipeline stages (its ``zero_stages``, with pipelining its
    ``zero_with_pipeline``) that plansim models (``unmodelled``): what the planner searches.

    >>> modelled_zero_stages("megatron", 1), modelled_zero_stages("deepspeed", 4), modelled_zero_stages("fsdp", 4)
    ([0, 1, 2, 3], [0, 1], [0, 3])
    """
    return list(_modelled(name, pp > 1))


def library_algorithms(name: str) -> tuple[str, ...]:
    """The data-parallel all-reduce algorithms framework ``name`` can run: those whose registry entry
    (``plansim.costs.collectives.ALLREDUCE_ALGORITHMS``) its ``collective_library`` runs, in registry order.

    >>> library_algorithms("megatron")
    ('nccl', 'ring')
    """
    from plansim.costs.collectives import ALLREDUCE_ALGORITHMS

    library = load_framework(name).rules.collective_library.value
    return tuple(a for a, entry in ALLREDUCE_ALGORITHMS.items() if entry.library == library)


def rule_differences(
    winner: str,
    other: str,
    zero: int = 0,
    pp: int = 1,
    tp: int = 1,
    schedule: str = "1f1b",
    *,
    architecture: str | None = None,
    attention: str = "flash",
) -> list[str]:
    """The behaviours in which framework ``other`` runs a strategy differently from ``winner``, in words, said of
    ``other`` (for the planner's explanation): each rule whose value differs and bears on a strategy with ZeRO stage
    ``zero``, ``pp`` pipeline stages, tensor parallelism ``tp`` and pipeline ``schedule`` (the winner's): the
    pipeline rules only with pipelining (whether the schedule's sends block, under it), the parameter gather's only
    under ZeRO-1/2, the tensor-parallel ones only with ``tp > 1``, the ZeRO rules only where ``other`` cannot run
    the winner's stage, the fused attention kernel only under ``attention: flash`` on a GPU of ``architecture``; how
    the host launches kernels, whether the optimizer clips and the recompute policies it runs, always.

    >>> for words in rule_differences("megatron", "deepspeed", pp=4):
    ...     print(words)
    gradients reduced in bf16, not fp32
    no overlap of the gradient reduction with pipelining
    gradient buckets of 5e+08 elements, not max(40000000, 1000000 x dp) parameters
    every pipeline stage bucketed, not only the first
    1f1b pipeline sends blocking, not blocking with a host synchronisation
    recompute policies none, full, not none, selective, full
    >>> fsdp = rule_differences("megatron", "fsdp", zero=3)
    >>> fsdp[2]
    'ZeRO-3 gathers 1 layer ahead, not layers ahead up to 5e+08 elements'
    >>> fsdp[3].split(" (")[0], fsdp[5]
    ('fp32 shards that are the master weights', 'hybrid sharding of ZeRO-3 (HSDP)')
    >>> fsdp[4]
    "each unit's gradients copied into a flat reduce-scatter buffer in the reduce dtype, not reduced in place"
    >>> rule_differences("megatron", "deepspeed", zero=1)[-2]
    'parameter all-gather after the optimizer step, not overlapped with the next forward'
    >>> rule_differences("deepspeed", "fsdp", zero=1)[-1]
    'no ZeRO-1 (it runs ZeRO 0, 2, 3)'
    >>> for words in rule_differences("megatron", "fsdp", tp=8)[2:4]:
    ...     print(words)
    no overlap of tensor-parallel collectives with the GEMMs (--tp-comm-overlap)
    tensor-parallel input-gradient reduction beside the weight-gradient GEMM: nothing
    >>> rule_differences("megatron", "deepspeed", architecture="hopper")[0]
    'fused attention by FlashAttention-2, not cuDNN'
    """
    a, b = load_framework(winner).rules, load_framework(other).rules
    out = []
    if attention == "flash":
        kernel_a = a.attention_kernel.value.kernel_for(architecture)
        kernel_b = b.attention_kernel.value.kernel_for(architecture)
        if kernel_a != kernel_b:
            out.append(f"fused attention by {KERNEL_TITLES[kernel_b]}, not {KERNEL_TITLES[kernel_a]}")
    if a.kernel_launch.value != b.kernel_launch.value:
        out.append(f"kernels launched {_launch(b.kernel_launch.value)}, not {_launch(a.kernel_launch.value)}")
    if a.grad_clip.value != b.grad_clip.value:
        out.append("gradients clipped by their global norm" if b.grad_clip.value else "no gradient clipping")
    if a.collective_library.value != b.collective_library.value:
        out.append(f"collectives in {b.collective_library.value}, not {a.collective_library.value}")
    if a.grad_reduce_fp32.value != b.grad_reduce_fp32.value:
        out.append("gradients reduced in " + ("fp32, not bf16" if b.grad_reduce_fp32.value else "bf16, not fp32"))
    if pp > 1 and a.grad_reduce_overlap_with_pipeline.value != b.grad_reduce_overlap_with_pipeline.value:
        out.append(
            ("overlap" if b.grad_reduce_overlap_with_pipeline.value else "no overlap")
            + " of the gradient reduction with pipelining"
        )
    if a.grad_bucket.value != b.grad_bucket.value:
        out.append(f"gradient buckets of {_bucket(b.grad_bucket.value)}, not {_bucket(a.grad_bucket.value)}")
    if pp > 1 and a.grad_buckets_first_chunk_only.value != b.grad_buckets_first_chunk_only.value:
        out.append(
            "only the first pipeline stage bucketed, not every one"
            if b.grad_buckets_first_chunk_only.value
            else "every pipeline stage bucketed, not only the first"
        )
    # ZeRO-2 as SHARD_GRAD_OP gathers per layer, not after the step; with pipelining plansim models neither
    shard_grad_op = zero == 2 and (a.zero2_shards_weights.value or b.zero2_shards_weights.value)
    if (
        zero == 1 or (zero == 2 and not shard_grad_op)
    ) and a.param_gather_overlap.value != b.param_gather_overlap.value:
        out.append(
            "parameter all-gather overlapped with the next forward, not after the optimizer step"
            if b.param_gather_overlap.value
            else "parameter all-gather after the optimizer step, not overlapped with the next forward"
        )
    if zero == 2 and pp == 1 and a.zero2_shards_weights.value != b.zero2_shards_weights.value:
        out.append(
            "ZeRO-2 with the weights sharded, gathered per layer in forward and kept until its backward "
            "(SHARD_GRAD_OP), not replicated"
            if b.zero2_shards_weights.value
            else "ZeRO-2 with the weights replicated, not sharded and gathered per layer (SHARD_GRAD_OP)"
        )
    if pp > 1 and (theirs := _sends(b, schedule)) != (mine := _sends(a, schedule)):
        out.append(f"{schedule} pipeline sends {theirs}, not {mine}")
    if zero == 3 and pp == 1 and a.param_prefetch.value != b.param_prefetch.value:
        out.append(f"ZeRO-3 gathers {_prefetch(b.param_prefetch.value)}, not {_prefetch(a.param_prefetch.value)}")
    if zero >= 2 and (zero in a.sharded_params_are_master.value) != (zero in b.sharded_params_are_master.value):
        out.append(
            "fp32 shards that are the master weights (4 + 4 + 8 bytes a parameter), not bf16 shards beside an fp32 "
            "master (2 + 4 + 12)"
            if zero in b.sharded_params_are_master.value
            else "bf16 shards beside an fp32 master (2 + 4 + 12 bytes a parameter), not fp32 shards that are the "
            "master weights (4 + 4 + 8)"
        )
    if zero >= 2 and (zero in a.grad_reduce_copy_in.value) != (zero in b.grad_reduce_copy_in.value):
        out.append(
            "each unit's gradients copied into a flat reduce-scatter buffer in the reduce dtype, not reduced in place"
            if zero in b.grad_reduce_copy_in.value
            else "gradients reduced in place, not copied per unit into a flat reduce-scatter buffer"
        )
    if zero >= 2 and (zero in a.hybrid_shard.value) != (zero in b.hybrid_shard.value):
        out.append(f"{'' if zero in b.hybrid_shard.value else 'no '}hybrid sharding of ZeRO-{zero} (HSDP)")
    if tp > 1 and (a.tp_comm_overlap.value is None) != (b.tp_comm_overlap.value is None):
        out.append(
            "no overlap of tensor-parallel collectives with the GEMMs (--tp-comm-overlap)"
            if b.tp_comm_overlap.value is None
            else "tensor-parallel collectives overlapped with the GEMMs (--tp-comm-overlap)"
        )
    if tp > 1 and a.tp_grad_input_overlap.value != b.tp_grad_input_overlap.value:
        beside = " and ".join(c.replace("_", "-") for c in b.tp_grad_input_overlap.value) or "nothing"
        out.append(f"tensor-parallel input-gradient reduction beside the weight-gradient GEMM: {beside}")
    if a.remat_policies.value != b.remat_policies.value:
        out.append(f"recompute policies {', '.join(b.remat_policies.value)}, not {', '.join(a.remat_policies.value)}")
    if zero not in modelled_zero_stages(other, pp):
        runs = b.zero_with_pipeline.value if pp > 1 else b.zero_stages.value
        where = " with pipelining" if pp > 1 else ""
        if zero in runs:
            out.append(f"ZeRO-{zero}{where} not modelled by plansim yet")
        else:
            out.append(f"no ZeRO-{zero}{where} (it runs ZeRO {', '.join(map(str, runs))})")
    return out


def _launch(k: KernelLaunch) -> str:
    return f"{k.mode}, {k.host_s * 1e6:g} us of host time each"


def _prefetch(p: ParamPrefetch) -> str:
    if p.layers is not None:
        return f"{p.layers} layer{'s' if p.layers > 1 else ''} ahead"
    return f"layers ahead {'while the live ones stay within' if p.live else 'up to'} {p.elements:.0e} elements"


def _sends(rules: FrameworkRules, schedule: str) -> str:
    sends = rules.pipeline_sends.value
    if schedule not in sends.blocking:
        return "beside compute"
    return "blocking with a host synchronisation" if sends.host_sync else "blocking"


def _bucket(g: GradBucket) -> str:
    if g.bytes is not None:
        return f"{g.bytes / 2**20:g} MiB"
    if g.elements is not None:
        return f"{g.elements:.0e} elements"
    return f"max({g.params}, {g.params_per_dp} x dp) parameters"
