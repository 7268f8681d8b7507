"""The parallel strategy: how one training step is split over GPUs (the schema and its parsing).

A strategy comes from a YAML file (``strategies/*.yaml`` or any path) or inline (``dp=8,tp=2,pp=4,zero=1``). Its
``schedule``, ``remat`` and ``dp_algorithm`` are validated against their registries (``SCHEDULES``,
``REMAT_POLICIES``, the all-reduce entries of ``COLLECTIVES``), so an entry added there is accepted here; numbers
take their bounds from ``plansim.limits``. ``Strategy.resolve`` fills in what the strategy leaves to its framework's
rules (``plansim.strategy.frameworks``). ``plansim.strategy.checks.check_strategy`` collects every violation against a
model and a cluster. A cache keys on a ``StrategyProjection``, the fields its computation reads.

A file or inline text may also hold ``seq_len``, the tokens per sequence the run trains at. That is the run's, not
the parallel strategy's, so it is no field of ``Strategy`` and no engine reads it there: ``read_strategy`` returns it
beside the strategy (``StrategyInput``) and ``plansim.api`` applies it to the model
(``plansim.workload.loader.with_seq_len``); ``Strategy.parse`` and ``load_strategy``, which return a strategy alone,
refuse it rather than drop it.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from plansim.arguments import type_name
from plansim.costs.collectives import ALLREDUCE_ALGORITHMS
from plansim.costs.remat_policies import REMAT_POLICIES
from plansim.errors import PlansimError, format_validation_error, quoted, shown, shown_path
from plansim.files.data import data_dir
from plansim.files.yamlfile import is_file, parse_yaml, read_mapping, refuse_special, validated
from plansim.limits import field, integral, whole
from plansim.pipeline.schedules import SCHEDULES
from plansim.strategy.frameworks import framework_names, is_framework, load_framework
from plansim.strategy.mesh import GRAD_AXES, REPLICA_AXES, mesh_of, ranks_of
from plansim.units import parse_bytes

if TYPE_CHECKING:
    from plansim.hardware import Cluster

__all__ = [
    "CP_ALGORITHMS",
    "DTYPES",
    "FP8_RECIPES",
    "OFFLOAD_KINDS",
    "OffloadKind",
    "Strategy",
    "StrategyInput",
    "StrategyProjection",
    "list_strategies",
    "load_strategy",
    "read_strategy",
    "read_with",
]

DTYPES = ("fp32", "fp16", "bf16", "fp8")

#: FP8 scaling recipes (``Strategy.fp8_recipe``), as Transformer Engine names its recipe classes
#: (transformer_engine/common/recipe/__init__.py at NVIDIA/TransformerEngine d0067d0d): ``delayed``
#: (DelayedScaling, per-tensor scales from an amax history), ``current`` (Float8CurrentScaling, per-tensor scales
#: from the tensor itself: Megatron-LM's and torchao's ``tensorwise``), ``block`` (Float8BlockScaling, 1x128 and
#: 128x128 blocks: Megatron-LM's ``blockwise``), ``mxfp8`` (MXFP8BlockScaling, 32-element blocks, Blackwell).
FP8Recipe = Literal["delayed", "current", "block", "mxfp8"]
FP8_RECIPES: tuple[str, ...] = get_args(FP8Recipe)

#: The key a strategy file or inline text may hold beside the strategy's fields: the run's sequence length (see the
#: module docstring).
_RUN_KEY = "seq_len"


def _grad_bytes(fp32: bool | None, dtype: str) -> int:
    """Bytes of one gradient element: 4 when accumulated and reduced in fp32 or in fp32 training, else 2."""
    return 4 if fp32 or dtype == "fp32" else 2


def _known_framework(value: str) -> str:
    """A validator: the value must name a framework profile (``frameworks/*.yaml``)."""
    if not is_framework(value):
        raise ValueError(f"framework={quoted(value)} is unknown: choose one of {', '.join(framework_names())}")
    return value


def _registered(field: str, registry: Mapping[str, object]) -> Callable[[object], object]:
    """A validator: the value must be a name in ``registry`` (the one list of those names)."""

    def check(value: object) -> object:
        if value not in registry:
            raise ValueError(f"{field}={quoted(value)} is unknown: choose one of {', '.join(registry)}")
        return value

    return check


#: Context parallelism's forms (``Strategy.cp_algorithm``): keys and values passed around a ring, or heads and sequence
#: swapped by all-to-all.
CPAlgorithm = Literal["ring", "all_to_all"]
CP_ALGORITHMS: tuple[str, ...] = get_args(CPAlgorithm)

#: What a strategy may keep in host memory (``Strategy.offload``; ``plansim.step.offload`` prices each).
OffloadKind = Literal["optimizer", "params", "activations"]
OFFLOAD_KINDS: tuple[str, ...] = get_args(OffloadKind)


class Strategy(BaseModel):
    """One parallel strategy. ``dp`` may be left out: it is then the GPU count over one replica's (the product of
    the other axes' degrees, ``plansim.strategy.mesh.REPLICA_AXES``: tp, cp and pp).

    >>> s = Strategy.parse("dp=2,tp=4,pp=2,micro_batch=1,global_batch=16")
    >>> (s.dp, s.tp, s.pp, s.num_microbatches)
    (2, 4, 2, 8)
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    dp: int | None = field("dp", default=None, description="data-parallel degree")
    tp: int = field("tp", default=1, description="tensor-parallel degree (Megatron column/row split)")
    pp: int = field("pp", default=1, description="pipeline-parallel stages")
    cp: int = field(
        "cp",
        default=1,
        description="context-parallel degree: each sequence split over this many ranks (2 x cp load-balanced chunks "
        "of a causal sequence), attention exchanging keys and values among them",
    )
    cp_algorithm: CPAlgorithm | None = Field(
        default=None,
        description="context parallelism's attention: ring (keys and values passed rank to rank beside the attention "
        "steps, Megatron-LM's --cp-comm-type p2p) or all_to_all (heads and sequence swapped around the attention, "
        "DeepSpeed-Ulysses; Megatron-LM's a2a); default: the framework's",
    )
    sequence_parallel: bool = False
    zero: Literal[0, 1, 2, 3] = 0
    micro_batch: int = field(
        "micro_batch", default=1, description="sequences per micro-batch per data-parallel replica"
    )
    global_batch: int | None = field("global_batch", default=None, description="sequences per step over all replicas")
    schedule: Annotated[str, AfterValidator(_registered("schedule", SCHEDULES))] = Field(
        default="1f1b", description="pipeline schedule, a name in plansim.pipeline.schedules.SCHEDULES"
    )
    virtual_stages: int = field(
        "virtual_stages", default=1, description="model chunks per pipeline stage (interleaved only)"
    )
    layer_split: tuple[Annotated[int, field("stage_blocks")], ...] | None = Field(
        default=None,
        max_length=10_000,
        description="transformer blocks per pipeline stage, first to last (pp entries; the first stage also holds "
        "the embedding, the last the output layer; inline: 5/7/7/5); with virtual_stages v > 1, blocks per model "
        "chunk in model order (pp*v entries, chunk c on stage c % pp, the first and last may be 0: Megatron-LM's "
        "--pipeline-model-parallel-layout) or pp entries, multiples of v, each spread over its stage's chunks; "
        "default: even, the first stages one more",
    )
    remat: Annotated[str, AfterValidator(_registered("remat", REMAT_POLICIES))] = Field(
        default="none", description="remat policy, a name in plansim.costs.remat_policies.REMAT_POLICIES"
    )
    remat_budget: float | None = field(
        "remat_budget",
        default=None,
        description="remat=milp: activation bytes per device (20GB, 16GiB or bytes); default: what the device "
        "leaves after model states, workspace and the embedding/output activations",
    )
    remat_granularity: Literal["op", "layer"] = Field(
        default="layer", description="remat=milp: schedule single ops or four-node blocks (faster)"
    )
    remat_time_limit_s: float = field(
        "time_limit_s", default=20.0, description="remat=milp: solver time limit per stage"
    )
    attention: Literal["flash", "unfused"] = Field(
        default="flash",
        description="flash: fused attention keeping no s x s scores (FlashAttention-2); unfused: QK^T, softmax, "
        "dropout and attention over V apart, as Megatron-LM ran them before flash attention (Korthikanti et al. 2022)",
    )
    dtype: Literal["fp32", "fp16", "bf16", "fp8"] | None = Field(
        default=None,
        description="training dtype; default bf16 where the GPU has it, else fp16; fp8: the transformer blocks' "
        "linear layers run their GEMMs in FP8 (Transformer Engine, torchao), all else as bf16",
    )
    fp8_recipe: FP8Recipe | None = Field(
        default=None,
        description="dtype=fp8: how FP8 tensors are scaled (delayed, current, block, mxfp8; Transformer Engine's "
        "recipes); default: the framework's",
    )
    fp8_param_gather: bool | None = Field(
        default=None,
        description="dtype=fp8: keep the fp8 layers' weights in FP8 and all-gather them in FP8 under ZeRO "
        "(Megatron-LM's --fp8-param-gather, torchao's enable_fsdp_float8_all_gather); default: the framework's",
    )
    dp_algorithm: Annotated[str, AfterValidator(_registered("dp_algorithm", ALLREDUCE_ALGORITHMS))] = Field(
        default="nccl",
        description="data-parallel all-reduce, a name in plansim.costs.collectives.ALLREDUCE_ALGORITHMS (nccl: what "
        "NCCL runs with NCCL_ALGO unset, as frameworks leave it; ring: NCCL_ALGO=Ring)",
    )
    framework: Annotated[str, AfterValidator(_known_framework)] = Field(
        default="megatron",
        description="the training framework whose behaviour the step follows, a profile in frameworks/ (megatron, "
        "deepspeed, fsdp); the three fields below default to its rules",
    )
    fp32_grad_accum: bool | None = Field(
        default=None,
        description="accumulate and reduce gradients in fp32 (Megatron-LM's main_grad); default: the framework's",
    )
    overlap_grad_reduce: bool | None = Field(
        default=None,
        description="overlap the gradient reduction with backward; default: wherever the framework does",
    )
    grad_bucket_bytes: int | None = field(
        "grad_bucket_bytes", default=None, description="gradient bucket size; default: the framework's"
    )
    overlap_param_gather: bool | None = Field(
        default=None,
        description="ZeRO-1/2: all-gather the updated weights under the next step's forward, bucket by bucket "
        "(Megatron-LM's --overlap-param-gather); default: wherever the framework does",
    )

    tp_comm_overlap: bool = Field(
        default=False,
        description="pipeline each transformer block's GEMMs with their tensor-parallel all-gathers and "
        "reduce-scatters, chunk by chunk (Megatron-LM's --tp-comm-overlap on Transformer Engine; needs sequence "
        "parallelism)",
    )
    offload: tuple[OffloadKind, ...] = Field(
        default=(),
        max_length=3,
        description="what lives in host memory (inline: offload=optimizer/params; YAML: a list): optimizer (the "
        "optimizer states and the Adam step on the CPU: ZeRO-Offload, Megatron-LM's --optimizer-cpu-offload), "
        "params (the parameter shards, fetched before each gather: ZeRO-Infinity, FSDP2's CPUOffloadPolicy), "
        "activations (each offloaded layer's saved activations, copied out and back: Megatron-LM's --cpu-offloading); "
        "default: none",
    )
    offload_activation_layers: int | None = field(
        "offload_layers",
        default=None,
        description="offload=activations: the transformer blocks whose activations are offloaded, the first ones "
        "(Megatron-LM's --cpu-offloading-num-layers, fewer than the model's blocks)",
    )
    ep: int = field(
        "ep",
        default=1,
        description="expert parallelism (mixture-of-experts models): the experts split over this many ranks, the "
        "expert layers seeing one pipeline stage's tp x cp x dp ranks regrouped as etp x ep x expert-dp "
        "(Megatron-LM's --expert-model-parallel-size)",
    )
    etp: int | None = field(
        "etp",
        default=None,
        description="tensor parallelism inside the experts (Megatron-LM's --expert-tensor-parallel-size); default: the "
        "framework's (Megatron-LM: the attention's tp; torchtitan: 1 with ep > 1)",
    )
    dp_shard: int | None = field(
        "dp_shard",
        default=None,
        description="hybrid sharding (HSDP, framework fsdp): shard the ZeRO-2/3 states over groups of this many "
        "data-parallel ranks, each a divisor of dp (a node's, ranks tp apart), and replicate across the groups; "
        "default: shard over all of dp",
    )

    def __init__(self, **data: Any) -> None:
        """``Strategy(dp=8, ...)``: a bad field is a one-line ``PlansimError`` naming it (as a file's would be),
        not pydantic's multi-line error."""
        try:
            super().__init__(**data)
        except ValidationError as err:
            raise PlansimError(format_validation_error("Strategy", err)) from None

    # pydantic's mark of its own __init__: model_validate (files, inline text: ``validated``) then validates without
    # calling this one, and reports the error under the file's name
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @field_validator(
        "dp",
        "dp_shard",
        "tp",
        "pp",
        "cp",
        "ep",
        "etp",
        "zero",
        "micro_batch",
        "global_batch",
        "virtual_stages",
        "grad_bucket_bytes",
        mode="before",
    )
    @classmethod
    def _whole(cls, value: object) -> object:
        return integral(value)  # a boolean or a string is refused, never read as 1 or 8

    @field_validator("layer_split", mode="before")
    @classmethod
    def _split_text(cls, value: object) -> object:
        """Inline strategies write a split as ``layer_split=5/7/7/5`` (a comma separates fields there; per model
        chunk with interleaving: ``layer_split=3/3/3/3/3/3/4/2``)."""
        if isinstance(value, str):
            try:
                return tuple(int(part) for part in value.split("/"))
            except ValueError:
                raise ValueError(f"'{shown(value)}': write blocks per stage as 5/7/7/5") from None
        value = integral(value)
        if isinstance(value, int):  # one stage: layer_split=24
            return (value,)
        if isinstance(value, list | tuple):
            return tuple(integral(part) for part in value)
        return value

    @field_validator("offload", mode="before")
    @classmethod
    def _offload_text(cls, value: object) -> object:
        """Inline strategies write ``offload=optimizer/params``; a YAML list or one name is read as it is; each kind
        once, in ``OFFLOAD_KINDS`` order (so equal sets compare equal)."""
        if isinstance(value, str):
            value = [part.strip() for part in value.split("/")] if value.strip() else []
        if isinstance(value, list | tuple):
            wrong = [v for v in value if v not in OFFLOAD_KINDS]
            if wrong:
                raise ValueError(f"'{shown(str(wrong[0]))}' is not offloadable: name {', '.join(OFFLOAD_KINDS)}")
            if len(set(value)) != len(value):
                raise ValueError("a kind is named twice: name each once")
            return tuple(k for k in OFFLOAD_KINDS if k in value)
        return value

    @field_validator("offload_activation_layers", mode="before")
    @classmethod
    def _whole_layers(cls, value: object) -> object:
        return integral(value)

    def model_dump(self, **kwargs: Any) -> dict[str, Any]:
        """The fields, the offload ones only where the strategy offloads and the expert ones only where they are
        not the default (a strategy without offloading or expert parallelism dumps as it did before they existed,
        so every stored result keeps its keys). A plain override, not a pydantic serializer: an interrupt while
        dumping stays a KeyboardInterrupt."""
        out = super().model_dump(**kwargs)
        if self.ep == 1:
            out.pop("ep", None)
        if self.etp is None:
            out.pop("etp", None)
        if not self.offload and self.offload_activation_layers is None:
            out.pop("offload", None)
            out.pop("offload_activation_layers", None)
        elif "offload" in out:
            out["offload"] = list(self.offload)
        return out

    @model_validator(mode="after")
    def _offload_layers(self) -> Strategy:
        if self.offload_activation_layers is not None and "activations" not in self.offload:
            raise ValueError(
                f"offload_activation_layers={self.offload_activation_layers} needs offload=activations: add "
                "activations to offload or drop offload_activation_layers"
            )
        return self

    @field_validator("remat_budget", mode="before")
    @classmethod
    def _budget_units(cls, value: object) -> object:
        return parse_bytes(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _interleaving(self) -> Strategy:
        if self.virtual_stages > 1 and not SCHEDULES[self.schedule].model_chunks:
            chunked = ", ".join(name for name, entry in SCHEDULES.items() if entry.model_chunks)
            raise ValueError(
                f"schedule={self.schedule} runs one model chunk per stage, got virtual_stages={self.virtual_stages}: "
                f"set virtual_stages=1 (or use schedule={chunked})"
            )
        return self

    @model_validator(mode="after")
    def _context_parallel_attention(self) -> Strategy:
        # Transformer Engine runs context parallelism in its fused and flash attention only ("Disabling
        # UnfusedDotProductAttention as it does not support context parallelism":
        # dot_product_attention/utils.py:1169-1173 at NVIDIA/TransformerEngine d0067d0d)
        if self.cp > 1 and self.attention != "flash":
            raise ValueError(f"cp={self.cp} runs on fused attention only: set attention=flash (or cp=1)")
        return self

    @model_validator(mode="after")
    def _fp8_fields(self) -> Strategy:
        if self.dtype != "fp8":
            given = [f"{name}={value}" for name in ("fp8_recipe", "fp8_param_gather") if (value := getattr(self, name))]
            if given:
                raise ValueError(f"{given[0]} needs dtype=fp8: set dtype=fp8 or leave it out")
        return self

    @property
    def num_gpus(self) -> int:
        """The GPUs the strategy spans: the product of its mesh axes' degrees (``plansim.strategy.mesh.ranks_of``;
        ``dp`` 1 until resolved)."""
        return ranks_of(self)

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per step per replica: global_batch / (micro_batch * dp); 1 when global_batch is unset."""
        dp = self.dp or 1
        if self.global_batch is None:
            return 1
        return max(1, self.global_batch // (self.micro_batch * dp))

    @property
    def batch(self) -> int:
        """Sequences per step over all replicas."""
        return self.global_batch if self.global_batch is not None else self.micro_batch * (self.dp or 1)

    @property
    def mixed_precision(self) -> bool:
        """fp16/bf16 compute with fp32 master weights (Micikevicius et al. 2018)."""
        return self.compute_dtype != "fp32"

    @property
    def grads_fp32(self) -> bool:
        """Whether gradients are accumulated and reduced in fp32: ``fp32_grad_accum``, or the framework's rule."""
        if self.fp32_grad_accum is not None:
            return self.fp32_grad_accum
        return load_framework(self.framework).rules.grad_reduce_fp32.value

    @property
    def hybrid_shard(self) -> bool:
        """Whether ZeRO's states are sharded over part of the data-parallel group and replicated across the parts
        (``dp_shard`` below ``dp``: HSDP)."""
        return self.dp_shard is not None and self.zero >= 1 and self.dp_shard < (self.dp or 1)

    @property
    def expert_tp(self) -> int:
        """Tensor parallelism inside the experts: ``etp``, or the framework's default (its ``expert_parallel`` rule:
        Megatron-LM's the attention's tp, arguments.py:587-588 at d98e8a64; torchtitan's 1 with ep > 1, its experts
        on the tp mesh without ep)."""
        if self.etp is not None:
            return self.etp
        if self.ep == 1:  # every framework's experts take the tensor-parallel ranks without ep
            return self.tp
        return load_framework(self.framework).rules.expert_parallel.value.default_etp(self.tp, self.ep)

    @property
    def shard_degree(self) -> int:
        """The ranks ZeRO shards its states over: ``dp_shard`` under hybrid sharding, else ``dp``, times ``cp`` (the
        context-parallel ranks hold the same weights: Megatron-LM's distributed optimizer shards over the
        data-parallel group with context parallelism, torchtitan's FSDP over ``dp_shard_cp``)."""
        return mesh_of(self).size(GRAD_AXES["dp_shard" if self.hybrid_shard else "dp"])

    @property
    def grad_bytes(self) -> int:
        """Bytes of one gradient element: 4 in fp32 (``grads_fp32``, or fp32 training), else 2."""
        return _grad_bytes(self.grads_fp32, self.compute_dtype)

    @property
    def compute_dtype(self) -> str:
        """The dtype activations, parameters and every kernel but the fp8 layers' GEMMs run in (bf16 until
        ``resolve`` picks one for a GPU): the training dtype, bf16 under ``dtype=fp8``, which stores activations,
        weights and gradients in bf16 as Transformer Engine and torchao do (``gemm_dtype`` is the fp8 GEMMs')."""
        return "bf16" if self.dtype == "fp8" else self.dtype or "bf16"

    @property
    def gemm_dtype(self) -> str:
        """The dtype of the transformer blocks' weight GEMMs (``plansim.costs.kernels``): fp8 under ``dtype=fp8``,
        else ``compute_dtype``."""
        return "fp8" if self.dtype == "fp8" else self.compute_dtype

    @property
    def fp8(self) -> bool:
        """Whether the blocks' linear layers run in FP8 (``dtype=fp8``)."""
        return self.dtype == "fp8"

    def resolve(self, cluster: Cluster) -> Strategy:
        """Fill in what was left out for ``cluster``: ``dp`` from its GPU count, ``dtype`` from what its GPU has, and
        the gradients' dtype, overlap and bucket from the framework's rules (``strategy.frameworks``): fp32 where it
        reduces in fp32, overlapped where it overlaps (with pipelining too, or only without), its bucket size at
        this ``dp`` (times ``cp``); with ``cp > 1``, the framework's form of context parallelism."""
        s = self.with_gpus(cluster.num_gpus)
        update: dict[str, Any] = {}
        if s.dtype is None:
            update["dtype"] = "bf16" if cluster.gpu.supports("bf16") else "fp16"
        if None in (s.fp32_grad_accum, s.overlap_grad_reduce, s.grad_bucket_bytes, s.overlap_param_gather):
            rules = load_framework(s.framework).rules
            if s.fp32_grad_accum is None:
                update["fp32_grad_accum"] = rules.grad_reduce_fp32.value
            if s.overlap_grad_reduce is None:
                update["overlap_grad_reduce"] = rules.grad_reduce_overlap.value and (
                    s.pp == 1 or rules.grad_reduce_overlap_with_pipeline.value
                )
            if s.grad_bucket_bytes is None:
                grads = _grad_bytes(
                    update.get("fp32_grad_accum", s.fp32_grad_accum), update.get("dtype", s.compute_dtype)
                )
                # Megatron-LM sizes it by the gradients' group, with the context-parallel ranks (dp_cp: training.py)
                update["grad_bucket_bytes"] = rules.grad_bucket.value.size_bytes(ranks_of(s, only=("dp", "cp")), grads)
            if s.overlap_param_gather is None:  # Megatron-LM: only with --overlap-grad-reduce (arguments.py:625-631)
                overlapped = update.get("overlap_grad_reduce", s.overlap_grad_reduce)
                update["overlap_param_gather"] = (
                    rules.param_gather_overlap.value and bool(overlapped) and s.zero in (1, 2)
                )
        if s.fp8 and (s.fp8_recipe is None or s.fp8_param_gather is None):
            fp8 = load_framework(s.framework).rules.fp8.value
            if s.fp8_recipe is None and fp8.default is not None:  # else refused by the checks (it runs no fp8)
                update["fp8_recipe"] = fp8.default
            if s.fp8_param_gather is None:
                update["fp8_param_gather"] = fp8.param_gather_default
        if s.cp > 1 and s.cp_algorithm is None:
            default = load_framework(s.framework).rules.context_parallel.value.default
            if default is not None:  # else refused by the checks (the framework runs none)
                update["cp_algorithm"] = default
        return s.model_copy(update=update) if update else s

    @property
    def is_resolved(self) -> bool:
        """Whether every field ``resolve`` fills in is set (dp, dtype and the framework's gradient defaults):
        resolving it again returns it unchanged."""
        return None not in (
            self.dp,
            self.dtype,
            self.fp32_grad_accum,
            self.overlap_grad_reduce,
            self.grad_bucket_bytes,
            self.overlap_param_gather,
        ) and (not self.fp8 or None not in (self.fp8_recipe, self.fp8_param_gather))

    def resolved(self, cluster: Cluster) -> Strategy:
        """``resolve`` for the boundaries that take a strategy as written or already resolved (the engines' entries,
        the lowering, the checks): a resolved one is returned as it is, so that one simulate call resolves its
        strategy once."""
        return self if self.is_resolved else self.resolve(cluster)

    def with_gpus(self, gpus: int) -> Strategy:
        """Fill in ``dp`` from the GPU count when it was left out."""
        if self.dp is not None:
            return self
        replica = ranks_of(self, besides=("dp",))
        if gpus % replica:
            raise PlansimError(
                f"strategy: --gpus {gpus} is not a multiple of {'*'.join(REPLICA_AXES)}={replica}: "
                f"set dp explicitly or change {'/'.join(REPLICA_AXES)}"
            )
        return self.model_copy(update={"dp": gpus // replica})

    @classmethod
    def parse(cls, text: str) -> Strategy:
        """A strategy from inline ``key=value,...`` text, a YAML path, or the name of a file in ``strategies/``.

        Raises
        ------
        PlansimError
            One line: empty text (saying what to write), a key given twice, an item that is not ``key=value``,
            the strategy's first few bad fields, or a ``seq_len`` (the run's: ``read_strategy`` reads it).
        """
        if not isinstance(text, str):
            raise PlansimError(
                f"strategy: expected 'dp=8,tp=2,...' text, a file or a shipped name, got {type_name(text)}"
            )
        return read_strategy(text).alone()


class StrategyProjection:
    """Base of a frozen dataclass whose fields are the strategy fields (or properties) one computation reads: a cache
    of that computation keys on ``Projection.of(strategy)``, defined next to the code that reads it. Strategies equal
    in the projection share the cached value, so a field the computation reads must be a field of its projection
    (``tests/test_analytic_cache.py`` varies every strategy field to check that they are). A field declared
    ``read_with(reader)`` holds ``reader(strategy)`` instead: what a computation reads of the strategy through
    something else (a framework's rules), said by the module that reads it (``plansim.step.tp_overlap.overlap_key``).

    >>> @dataclasses.dataclass(frozen=True)
    ... class Degree(StrategyProjection):
    ...     tp: int
    ...     gpus: int = read_with(lambda s: s.num_gpus)
    >>> Degree.of(Strategy(dp=2, tp=4))
    Degree(tp=4, gpus=8)
    """

    _read: ClassVar[Callable[[Strategy], tuple[Any, ...]]]

    @classmethod
    def of(cls, s: Strategy) -> Any:
        read = cls.__dict__.get("_read")
        if read is None:
            fields = dataclasses.fields(cls)  # type: ignore[arg-type]
            readers = [f.metadata.get(_READER) for f in fields]
            if any(readers):
                getters = [r or operator.attrgetter(f.name) for f, r in zip(fields, readers, strict=True)]
                read = lambda x: tuple(g(x) for g in getters)  # noqa: E731
            else:
                getter = operator.attrgetter(*(f.name for f in fields))
                read = (lambda x: (getter(x),)) if len(fields) == 1 else getter
            cls._read = read
        return cls(*read(s))


#: The metadata key of a projection field's reader (``read_with``).
_READER = "plansim_reader"


def read_with(reader: Callable[[Strategy], Any]) -> Any:
    """A ``StrategyProjection`` field whose value is ``reader(strategy)`` rather than the strategy's attribute of the
    field's name."""
    return dataclasses.field(metadata={_READER: reader})


def _parse_inline(text: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise PlansimError(f"strategy: '{shown(item.strip())}' is not key=value: write e.g. dp=8,tp=2,pp=1")
        if key in fields:
            raise PlansimError(f"strategy: '{shown(key)}' is given twice: keep one {shown(key)}=... (e.g. dp=8,tp=2)")
        fields[key] = parse_yaml(value.strip(), f"strategy: {shown(key)}")
    return fields


def _what_to_write(shown_names: int = 4) -> str:
    """The fix for a strategy that is missing or not found: the inline form and a few shipped names."""
    names = list_strategies()
    listed = ", ".join(names[:shown_names]) + (", ..." if len(names) > shown_names else "")
    return f"give key=value pairs such as dp=8,tp=2,pp=1 or a shipped strategy name ({listed})"


def _validate(fields: object, source: str) -> Strategy:
    if not isinstance(fields, dict):
        raise PlansimError(f"{source}: expected a mapping of strategy fields such as 'dp: 8'")
    return validated(Strategy, fields, source)


def list_strategies() -> list[str]:
    """Names of the strategy files shipped in ``strategies/``."""
    return sorted(p.stem for p in data_dir("strategies").glob("*.yaml"))


def load_strategy(name_or_path: str | Path) -> Strategy:
    """Load a strategy from a YAML path or from ``strategies/<name>.yaml`` (a ``seq_len`` in it is refused:
    ``read_strategy`` reads it)."""
    if not isinstance(name_or_path, str | Path):
        raise PlansimError(f"strategy: expected a strategy file or a shipped name, got {type_name(name_or_path)}")
    return _from_file(name_or_path).alone()


def _from_file(name_or_path: str | Path) -> StrategyInput:
    if not str(name_or_path).strip():
        raise PlansimError(f"strategy: empty: {_what_to_write()}")
    path = Path(name_or_path)
    if not is_file(path):
        shipped = data_dir("strategies") / f"{name_or_path}.yaml"
        if not is_file(shipped):
            refuse_special(path, "strategy")  # a FIFO, a folder, a symlink loop: never opened, said so
            raise PlansimError(
                f"strategy: '{shown(str(name_or_path))}' is not a file, key=value text or a shipped strategy: "
                f"{_what_to_write()}"
            )
        path = shipped
    return _split(read_mapping(path, "strategy"), shown_path(path))


@dataclass(frozen=True)
class StrategyInput:
    """A strategy as given, with the run's ``seq_len`` its file or text holds beside it (None: none) and the
    ``source`` that names it in messages (the file, or ``strategy``)."""

    strategy: Strategy
    seq_len: int | None = None
    source: str = "strategy"

    def alone(self) -> Strategy:
        """The strategy, where nothing is held beside it; a ``PlansimError`` where a ``seq_len`` is (never dropped)."""
        if self.seq_len is not None:
            raise PlansimError(
                f"{self.source}: seq_len {self.seq_len} is the run's tokens per sequence, not a strategy field: pass "
                "this strategy to simulate or compare, which apply it to the model (read_strategy reads both)"
            )
        return self.strategy


def read_strategy(given: str | Path | Mapping[str, Any]) -> StrategyInput:
    """A strategy from inline ``key=value,...`` text, a YAML path, the name of a file in ``strategies/`` or a mapping
    of fields, with the run's ``seq_len`` the text, file or mapping holds beside it (checked against
    ``plansim.limits``).

    >>> given = read_strategy("dp=8,micro_batch=2,seq_len=4096")
    >>> given.strategy.micro_batch, given.seq_len
    (2, 4096)
    >>> read_strategy("dp=8,seq_len=0")
    Traceback (most recent call last):
    ...
    plansim.errors.PlansimError: strategy: seq_len 0: at least 1
    """
    if isinstance(given, Mapping):
        return _split(dict(given), "strategy")
    if isinstance(given, Path):
        return _from_file(given)
    if not isinstance(given, str):
        raise PlansimError(f"strategy: expected 'dp=8,tp=2,...' text, a file or a shipped name, got {type_name(given)}")
    text = given.strip()
    if "=" in text:
        return _split(_parse_inline(text), "strategy")
    return _from_file(text)


def _split(fields: object, source: str) -> StrategyInput:
    """The strategy of ``fields`` and the run's ``seq_len`` among them (``_RUN_KEY``), each checked."""
    seq_len = None
    if isinstance(fields, dict) and _RUN_KEY in fields:
        seq_len = fields[_RUN_KEY]
        fields = {k: v for k, v in fields.items() if k != _RUN_KEY}
    strategy = _validate(fields, source)
    if seq_len is None:
        return StrategyInput(strategy, None, source)
    return StrategyInput(strategy, whole(seq_len, "seq_len", f"{source}: seq_len"), source)
