"""The parallel strategy: how one training step is split over GPUs, and its checks against a model and a cluster.

A strategy comes from a YAML file (``strategies/*.yaml`` or any path) or inline (``dp=8,tp=2,pp=4,zero=1``).
``check_strategy`` collects every violation against a model and a cluster; each message names the field and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from plansim.data import data_dir
from plansim.errors import PlansimError
from plansim.units import parse_bytes
from plansim.yamlfile import parse_yaml, read_mapping, validated

if TYPE_CHECKING:
    from plansim.hardware import Cluster
    from plansim.workload import ModelSpec
    from plansim.workload.traced import Workload

__all__ = [
    "DP_ALGORITHMS",
    "DTYPES",
    "REMAT_POLICIES",
    "SCHEDULES",
    "Strategy",
    "check_strategy",
    "list_strategies",
    "load_strategy",
]

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
REMAT_POLICIES = ("none", "full", "selective", "sqrt", "milp")
DTYPES = ("fp32", "fp16", "bf16")
DP_ALGORITHMS = ("ring", "tree", "butterfly", "naive", "ps", "hierarchical")


class Strategy(BaseModel):
    """One parallel strategy. ``dp`` may be left out: it is then the GPU count over ``tp * pp``.

    >>> s = Strategy.parse("dp=2,tp=4,pp=2,micro_batch=1,global_batch=16")
    >>> (s.dp, s.tp, s.pp, s.num_microbatches)
    (2, 4, 2, 8)
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    dp: int | None = Field(default=None, ge=1, description="data-parallel degree")
    tp: int = Field(default=1, ge=1, description="tensor-parallel degree (Megatron column/row split)")
    pp: int = Field(default=1, ge=1, description="pipeline-parallel stages")
    sequence_parallel: bool = False
    zero: Literal[0, 1, 2, 3] = 0
    micro_batch: int = Field(default=1, ge=1, description="sequences per micro-batch per data-parallel replica")
    global_batch: int | None = Field(default=None, ge=1, description="sequences per step over all replicas")
    schedule: Literal["gpipe", "1f1b", "interleaved", "zb-h1"] = "1f1b"
    virtual_stages: int = Field(default=1, ge=1, description="model chunks per pipeline stage (interleaved only)")
    layer_split: tuple[int, ...] | None = Field(
        default=None,
        description="transformer blocks per pipeline stage, first to last (pp entries; the first stage also holds "
        "the embedding, the last the output layer; inline: 5/7/7/5); default: even, the first stages one more",
    )
    remat: Literal["none", "full", "selective", "sqrt", "milp"] = "none"
    remat_budget: float | None = Field(
        default=None,
        ge=0,
        description="remat=milp: activation bytes per device (20GB, 16GiB or bytes); default: what the device "
        "leaves after model states, workspace and the embedding/output activations",
    )
    remat_granularity: Literal["op", "layer"] = Field(
        default="layer", description="remat=milp: schedule single ops or four-node blocks (faster)"
    )
    remat_time_limit_s: float = Field(default=20.0, gt=0, description="remat=milp: solver time limit per stage")
    dtype: Literal["fp32", "fp16", "bf16"] | None = Field(
        default=None, description="training dtype; default bf16 where the GPU has it, else fp16"
    )
    dp_algorithm: Literal["ring", "tree", "butterfly", "naive", "ps", "hierarchical"] = "ring"
    fp32_grad_accum: bool = Field(default=False, description="keep fp32 gradient buffers as Megatron's main_grad")
    overlap_grad_reduce: bool = Field(default=True, description="overlap the gradient reduction with backward")
    grad_bucket_bytes: int = Field(default=25 * 2**20, ge=1, description="gradient bucket size (PyTorch DDP: 25 MiB)")

    @field_validator("layer_split", mode="before")
    @classmethod
    def _split_text(cls, value: object) -> object:
        """Inline strategies write a split as ``layer_split=5/7/7/5`` (a comma separates fields there)."""
        if isinstance(value, int) and not isinstance(value, bool):  # one stage: layer_split=24
            return (value,)
        if isinstance(value, str):
            try:
                return tuple(int(part) for part in value.split("/"))
            except ValueError:
                raise ValueError(f"'{value}': write blocks per stage as 5/7/7/5") from None
        return value

    @field_validator("remat_budget", mode="before")
    @classmethod
    def _budget_units(cls, value: object) -> object:
        return parse_bytes(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _interleaving(self) -> Strategy:
        if self.virtual_stages > 1 and self.schedule == "zb-h1":
            raise ValueError(
                f"schedule=zb-h1 runs one model chunk per stage, got virtual_stages={self.virtual_stages}: "
                "set virtual_stages=1 (or use schedule=interleaved)"
            )
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise ValueError(
                f"virtual_stages={self.virtual_stages} needs schedule=interleaved (or set virtual_stages=1)"
            )
        return self

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
    def compute_dtype(self) -> str:
        """The training dtype (bf16 until ``resolve`` picks one for a GPU)."""
        return self.dtype or "bf16"

    def resolve(self, cluster: Cluster) -> Strategy:
        """Fill in what was left out for ``cluster``: ``dp`` from its GPU count, ``dtype`` from what its GPU has."""
        s = self.with_gpus(cluster.num_gpus)
        if s.dtype is None:
            s = s.model_copy(update={"dtype": "bf16" if cluster.gpu.supports("bf16") else "fp16"})
        return s

    def with_gpus(self, gpus: int) -> Strategy:
        """Fill in ``dp`` from the GPU count when it was left out."""
        if self.dp is not None:
            return self
        if gpus % (self.tp * self.pp):
            raise PlansimError(
                f"strategy: --gpus {gpus} is not a multiple of tp*pp={self.tp * self.pp}: "
                "set dp explicitly or change tp/pp"
            )
        return self.model_copy(update={"dp": gpus // (self.tp * self.pp)})

    @classmethod
    def parse(cls, text: str) -> Strategy:
        """A strategy from inline ``key=value,...`` text, a YAML path, or the name of a file in ``strategies/``."""
        text = text.strip()
        if "=" in text:
            return _validate(_parse_inline(text), "strategy")
        return load_strategy(text)


def _parse_inline(text: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PlansimError(f"strategy: '{item}' is not key=value: write e.g. dp=8,tp=2,pp=1")
        fields[key.strip()] = parse_yaml(value.strip(), "strategy")
    return fields


def _validate(fields: object, source: str) -> Strategy:
    if not isinstance(fields, dict):
        raise PlansimError(f"{source}: expected a mapping of strategy fields such as 'dp: 8'")
    return validated(Strategy, fields, source)


def list_strategies() -> list[str]:
    """Names of the strategy files shipped in ``strategies/``."""
    return sorted(p.stem for p in data_dir("strategies").glob("*.yaml"))


def load_strategy(name_or_path: str | Path) -> Strategy:
    """Load a strategy from a YAML path or from ``strategies/<name>.yaml``."""
    path = Path(name_or_path)
    if not path.is_file():
        shipped = data_dir("strategies") / f"{name_or_path}.yaml"
        if not shipped.is_file():
            known = ", ".join(list_strategies())
            raise PlansimError(
                f"strategy: '{name_or_path}' is neither a file, key=value text nor a shipped strategy ({known})"
            )
        path = shipped
    return _validate(read_mapping(path, "strategy"), str(path))


def check_strategy(strategy: Strategy, model: Workload, cluster: Cluster) -> list[str]:
    """Every way ``strategy`` cannot run ``model`` on ``cluster``; empty when it can. Each message names the fix.
    A traced model (``plansim.workload.traced``) also needs tp=1, its traced batch as micro-batch and its dtype."""
    s = strategy.resolve(cluster)
    dp = s.dp or 1
    problems: list[str] = []
    if dp * s.tp * s.pp != cluster.num_gpus:
        problems.append(
            f"dp*tp*pp = {dp}*{s.tp}*{s.pp} = {dp * s.tp * s.pp} but --gpus is {cluster.num_gpus}: make them equal"
        )
    problems += _check_model_split(s, model)
    problems += _check_batch(s, dp)
    if s.zero >= 2 and s.pp > 1:
        problems.append(
            f"zero={s.zero} with pp={s.pp}: ZeRO-2/3 partition gradients per micro-batch, which pipeline "
            "parallelism does not support (DeepSpeed); use zero=1 or pp=1"
        )
    if s.dp_algorithm == "butterfly" and dp & (dp - 1):
        problems.append(f"dp_algorithm=butterfly needs a power-of-two dp, got dp={dp}: use dp_algorithm=ring")
    if s.tp > cluster.gpus_per_node:
        problems.append(
            f"tp={s.tp} spans more than one node ({cluster.gpus_per_node} GPUs): use tp <= {cluster.gpus_per_node}"
        )
    if not cluster.gpu.supports(s.compute_dtype):
        problems.append(f"dtype={s.dtype}: {cluster.gpu.name} does not support it: use dtype=fp16 or fp32")
    return problems


def _check_model_split(s: Strategy, model: Workload) -> list[str]:
    from plansim.workload.torch_trace import TracedModel
    from plansim.workload.traced import traced_problems

    problems = traced_problems(s, model) if isinstance(model, TracedModel) else _check_family(s, model)
    chunks = s.pp * s.virtual_stages
    if s.layer_split is not None:
        split = s.layer_split
        if s.virtual_stages > 1:
            problems.append("layer_split applies to one model chunk per stage: leave it out with schedule=interleaved")
        elif len(split) != s.pp or min(split) < 1 or sum(split) != model.layers:
            problems.append(
                f"layer_split={list(split)}: needs pp={s.pp} entries of at least 1 block summing to "
                f"layers={model.layers}"
            )
    if model.layers < chunks:
        problems.append(f"pp*virtual_stages={chunks} exceeds layers={model.layers}: use fewer pipeline stages")
    elif s.schedule == "interleaved" and model.layers % chunks:
        problems.append(
            f"schedule=interleaved needs layers={model.layers} divisible by pp*virtual_stages={chunks}: "
            "change pp or virtual_stages"
        )
    if s.schedule == "interleaved" and s.pp == 1:
        problems.append("schedule=interleaved needs pp > 1: use schedule=1f1b")
    if s.schedule == "interleaved" and s.virtual_stages < 2:
        problems.append(
            "schedule=interleaved needs virtual_stages >= 2 (model chunks per stage): "
            "set virtual_stages=2 or use schedule=1f1b"
        )
    return problems


def _check_family(s: Strategy, model: ModelSpec) -> list[str]:
    """What a model family allows of tensor parallelism (the builders' sharding)."""
    problems = []
    if model.family in ("gpt", "llama"):
        if model.heads % s.tp:
            problems.append(f"tp={s.tp} does not divide heads={model.heads}: choose tp among the divisors of the heads")
        elif model.kv_heads % s.tp:
            problems.append(f"tp={s.tp} does not divide kv_heads={model.kv_heads}: use tp <= {model.kv_heads}")
    if model.family == "cnn" and s.tp > 1:
        problems.append(f"tp={s.tp}: cnn models support tp=1 only: use dp or pp")
    return problems


def _check_batch(s: Strategy, dp: int) -> list[str]:
    if s.global_batch is None:
        return []
    per_step = s.micro_batch * dp
    if s.global_batch % per_step:
        return [
            f"global_batch={s.global_batch} is not a multiple of micro_batch*dp={per_step}: "
            f"use global_batch={max(per_step, s.global_batch // per_step * per_step)}"
        ]
    m = s.global_batch // per_step
    if s.schedule == "interleaved" and m % s.pp:
        return [
            f"schedule=interleaved needs the micro-batch count {m} to be a multiple of pp={s.pp} "
            "(Megatron-LM): change global_batch"
        ]
    return []
