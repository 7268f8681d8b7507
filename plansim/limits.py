"""Every number a user gives, and the work a run may take: the ranges, in one table, with the reason for each.

A number outside its range is refused before any work starts, with a one-line ``PlansimError`` that names the
option (or file field), the value and the limit. The schemas (``ModelSpec``, ``Strategy``) take their bounds from
``LIMITS`` through ``field``, so model files, strategy files, inline strategies and Python calls are checked alike;
the CLI and the Python API check the rest with ``whole`` and ``number``. ``docs/limits.md`` lists the same table
(``tests/test_limits.py`` checks that it does).

Work bounds (``WORK``) cap what a run may cost: the planner's candidates and the blocks it walks (counted before
pricing by ``plansim.planner.space.search_work``), a sweep's points and blocks, the discrete-event tasks of one run
and of the planner's finalists, and the topology graph. The user can raise each with an environment variable, and the
refusal says which.

>>> whole(8, "gpus", "--gpus")
8
>>> whole(2**64, "gpus", "--gpus")
Traceback (most recent call last):
...
plansim.errors.PlansimError: --gpus 18446744073709551616: at most 1,048,576 GPUs (the largest training clusters \
of 2024 hold about 10^5 GPUs)
>>> number(float("nan"), "jitter", "--jitter")
Traceback (most recent call last):
...
plansim.errors.PlansimError: --jitter nan: must be a finite number from 0 to 1
"""

from __future__ import annotations

import math
import operator
import os
from dataclasses import dataclass
from numbers import Real
from typing import Any

from pydantic import Field

from plansim.errors import PlansimError, shown

__all__ = [
    "LIMITS",
    "WORK",
    "Limit",
    "Work",
    "field",
    "integral",
    "machine_cores",
    "number",
    "refuse_work",
    "whole",
    "work_bound",
]


@dataclass(frozen=True)
class Limit:
    """The range of one kind of number: ``low <= x <= high`` (``low < x`` when ``low_open``), whole or real."""

    low: float
    high: float
    unit: str
    reason: str
    integer: bool = True
    low_open: bool = False

    def describe(self) -> str:
        """The range in words: ``1 to 1,048,576`` or ``> 0 to 86,400``."""
        low = f"> {_fmt(self.low)}" if self.low_open else _fmt(self.low)
        return f"{low} to {_fmt(self.high)}"


def _fmt(x: float) -> str:
    if isinstance(x, int):
        return f"{x:,}"
    return f"{int(x):,}" if x.is_integer() and abs(x) < 1e15 else f"{x:g}"


def _said(name: str, value: object) -> str:
    """``--gpus 8``, ``--straggler 3=nan`` (a name ending in ``=`` takes the value without a space); text quoted."""
    text = shown(repr(value)) if isinstance(value, str) else shown(value)
    return f"{name}{text}" if name.endswith("=") else f"{name} {text}"


_DEGREE = "a parallel degree cannot exceed the GPU count"
_CLUSTER = "the largest training clusters of 2024 hold about 10^5 GPUs"

#: key -> its range. Sources: the model sizes from the largest published models (GPT-3: 96 blocks, width 12,288,
#: Brown et al. 2020, Table 2.1; PaLM: width 18,432, vocabulary 256k, Chowdhery et al. 2022, Table 1; Gemma: 256k
#: vocabulary; Llama 3.1 405B: 126 blocks, width 16,384, FFN 53,248, 128k context, Dubey et al. 2024, Table 3).
#: Each bound leaves one to two orders of magnitude of headroom and keeps one pricing within seconds.
LIMITS: dict[str, Limit] = {
    "gpus": Limit(1, 2**20, "GPUs", _CLUSTER),
    "dp": Limit(1, 2**20, "", _DEGREE),
    "dp_shard": Limit(1, 2**20, "", _DEGREE),
    "tp": Limit(1, 2**20, "", _DEGREE),
    "pp": Limit(1, 2**20, "", _DEGREE),
    "cp": Limit(1, 2**20, "", _DEGREE),
    "ep": Limit(1, 2**20, "", _DEGREE),
    "etp": Limit(1, 2**20, "", _DEGREE),
    "virtual_stages": Limit(1, 10_000, "", "model chunks per stage cannot exceed the blocks"),
    "layers": Limit(
        1, 10_000, "blocks", "the deepest published LLMs have 96-126 blocks; one op-graph walk of 10,000 takes ~1 s"
    ),
    "hidden": Limit(1, 2**18, "", "the widest published LLMs are 12,288-20,480 wide (GPT-3, PaLM, MT-NLG)"),
    "heads": Limit(0, 2**16, "", "heads divide the width (0: families without attention)"),
    "kv_heads": Limit(0, 2**16, "", "key/value heads divide the heads (0: families without attention)"),
    "ffn_hidden": Limit(0, 2**20, "", "published FFN widths reach 53,248 (Llama 3.1 405B); 0: cnn"),
    "head_dim": Limit(0, 2**12, "", "published heads are 64-256 wide (Qwen3: 128, DeepSeek-V3: 192); 0: no attention"),
    "experts": Limit(0, 2**14, "", "published MoE models route over 8-256 experts (Mixtral, DeepSeek-V3); 0: not moe"),
    "experts_per_token": Limit(0, 2**14, "", "top-k of 1-8 in published models; at most the experts; 0: not moe"),
    "expert_ffn_hidden": Limit(0, 2**20, "", "as ffn_hidden (Mixtral 8x22B's experts are 16,384 wide); 0: not moe"),
    "shared_ffn_hidden": Limit(0, 2**20, "", "as ffn_hidden; 0: no shared experts"),
    "dense_layers": Limit(0, 10_000, "blocks", "as layers (DeepSeek-V3's first 3 blocks are dense)"),
    "capacity_factor": Limit(
        0, 64, "", "published capacity factors are 1-2 (GShard, Switch); 0: dropless", integer=False
    ),
    "moe_imbalance": Limit(
        1,
        2**14,
        "",
        "1: balanced; the busiest of ep ranks receives at least the mean and at most every routed token, ep times "
        "the mean (ep <= experts <= 2^14): a value above ep prices as ep",
        integer=False,
    ),
    "moe_imbalance_spread": Limit(
        0,
        4,
        "",
        "a log-normal's standard deviation of the log; 4 already puts 1 in 10^4 draws 10^7 times the mean",
        integer=False,
    ),
    "q_lora_rank": Limit(0, 2**18, "", "DeepSeek-V3's query latent is 1,536 wide; 0: full-rank queries"),
    "kv_lora_rank": Limit(0, 2**18, "", "DeepSeek-V3's key/value latent is 512 wide; 0: no latent attention"),
    "rope_head_dim": Limit(0, 2**12, "", "DeepSeek-V3 rotates 64 of each head's 192 query/key columns"),
    "v_head_dim": Limit(0, 2**12, "", "as head_dim (DeepSeek-V3's value heads are 128 wide)"),
    "seq_len": Limit(1, 2**24, "tokens", "the longest context windows of 2024 are 10^6-10^7 tokens"),
    "vocab": Limit(1, 2**24, "", "the largest vocabularies hold about 256k tokens (PaLM, Gemma)"),
    "image_size": Limit(0, 8192, "pixels", "ResNet inputs are 224-600 pixels; 0: not a cnn"),
    "stage_blocks": Limit(0, 10_000, "blocks", "as layers (an empty stage is named by the strategy and model checks)"),
    "micro_batch": Limit(1, 2**24, "sequences", "as global_batch"),
    "global_batch": Limit(
        1,
        2**24,
        "sequences",
        "GPT-3 trained on 1,536 sequences per step, LAMB on 65,536 images; 2^24 bounds the planner's divisor search",
    ),
    "grad_bucket_bytes": Limit(1, 2**40, "bytes", "PyTorch DDP's default is 25 MiB; 1 TiB exceeds any GPU"),
    "remat_budget": Limit(0, 1e15, "bytes", "1 PB exceeds any GPU's memory", integer=False),
    "time_limit_s": Limit(0, 86_400, "s", "a solver limit of a day; 0 returns the best fixed baseline", integer=False),
    "jitter": Limit(
        0, 1, "", "log-normal sigma: at 1 a kernel's time varies e^+-2 = 7x in 95% of draws", integer=False
    ),
    "straggler_factor": Limit(
        0, 1e3, "", "a slow-down factor: 1.5 is 50% slower; 1000x slower is a failed GPU", integer=False, low_open=True
    ),
    "link_factor": Limit(
        0,
        1e3,
        "",
        "a bandwidth factor: 0.5 halves a link; remove a failed one with --fail-link",
        integer=False,
        low_open=True,
    ),
    "seed": Limit(0, 2**64 - 1, "", "a 64-bit seed"),
    "gpus_per_node": Limit(1, 1_024, "GPUs", "the largest scale-up domains hold 72 GPUs (NVIDIA GB200 NVL72)"),
    "nics": Limit(1, 1_024, "NICs", "a node has one NIC per GPU or fewer"),
    "nodes_per_switch": Limit(1, 2**20, "nodes", "as gpus"),
    "memory_bytes": Limit(1, 2**50, "bytes", "GPUs of 2024 hold at most 192 GB; 1 PiB exceeds any"),
    "workspace_reserve_bytes": Limit(0, 2**50, "bytes", "as memory_bytes"),
    "cuda_context_bytes": Limit(0, 2**50, "bytes", "as memory_bytes"),
    "nccl_channels": Limit(
        1, 64, "channels", "NCCL runs a collective or a send on 1 to MAXCHANNELS = 64 channels (src/include/device.h)"
    ),
    "nvls_channels": Limit(0, 64, "channels", "as nccl_channels; 0: the node has no NVLink SHARP"),
    "kernel_launch_s": Limit(0, 1, "s", "launch overheads are microseconds", integer=False),
    "cv": Limit(0, 1, "", "a coefficient of variation (std / mean); kernel times vary by a few percent", integer=False),
    "oversubscription": Limit(1, 1e6, "", "a tier's taper over the NICs (1: non-blocking)", integer=False),
    "hardware_number": Limit(
        0,
        1e18,
        "",
        "hardware bandwidths (B/s), rates (FLOP/s), latencies (s) and curve sizes: above 10^18 is no device's",
        integer=False,
        low_open=True,
    ),
    "rank": Limit(0, 2**20 - 1, "", "a GPU's rank, below the GPU count"),
    "top_k": Limit(1, 1_000, "finalists", "each finalist is re-simulated"),
    "jobs": Limit(1, 1_024, "processes", "worker processes beyond the machine's cores only add start-up time"),
    "tokens": Limit(0, 1e18, "tokens", "the largest training runs of 2024 saw about 1.5e13 tokens", False, True),
    "price_per_gpu_hour": Limit(0, 1e6, "", "a price per GPU-hour", integer=False),
    "stage_layers": Limit(1, 10_000, "blocks", "as layers"),
    "warmup": Limit(0, 10_000, "runs", "untimed runs before timing; a few settle clocks and caches"),
    "repeats": Limit(1, 100_000, "runs", "timed runs whose median is kept"),
    "in_flight": Limit(1, 2**24, "micro-batches", "at most the micro-batches of a step", integer=False),
    "gap": Limit(0, 1, "", "a relative gap below 1, e.g. 0.01 for 1%", integer=False),
    "headroom": Limit(
        0, 0.9, "", "a fraction of the GPU's memory left free at the peak: 0.05 for 5%; 0 lets a plan fill it", False
    ),
    "headroom_bytes": Limit(0, 1e15, "bytes", "a size left free of each GPU's memory at the peak: 4GB", False),
    "curve_points": Limit(0, 100, "budgets", "each budget is a MILP solve; 0 writes the schedule alone"),
    "offload_layers": Limit(0, 10_000, "blocks", "as layers: Megatron-LM offloads fewer than the model's blocks"),
    "host_memory_bytes": Limit(1, 2**50, "bytes", "a node's host memory: DGX H100 holds 2 TB; 1 PiB exceeds any"),
    "gpus_per_uplink": Limit(1, 1_024, "GPUs", "GPUs behind one host uplink: at most the node's GPUs"),
}


@dataclass(frozen=True)
class Work:
    """A bound on the work of one run; the environment variable ``env`` raises (or lowers) it."""

    default: int
    env: str
    what: str
    reason: str


WORK: dict[str, Work] = {
    "candidates": Work(
        200_000,
        "PLANSIM_MAX_CANDIDATES",
        "candidate strategies",
        "4-10 min and 3.6 GB: some 300-900 are priced per second on a shared 2-core machine, 18 kB each (the "
        "blocks and memory bounds below usually refuse first)",
    ),
    "plan_blocks": Work(
        2_000_000,
        "PLANSIM_MAX_PLAN_BLOCKS",
        "blocks walked",
        "1.5-5 min: the analytic engine walks some 7,000-20,000 blocks per second, each candidate its busiest "
        "stage's (GPT-3 175B on 1,024 GPUs: 603,880 in 31 s)",
    ),
    "des_tasks": Work(
        2_000_000,
        "PLANSIM_MAX_DES_TASKS",
        "tasks and transfers",
        "20-60 s: some 100,000 are simulated per second",
    ),
    "sweep_points": Work(
        10_000,
        "PLANSIM_MAX_SWEEP_POINTS",
        "grid points",
        "each point is a plan: benchmarks/bench_sweep.py's 200 points took 157 s on 2 cores, so 10,000 take "
        "about 2 hours on one (less with --jobs or a Dask cluster)",
    ),
    "sweep_blocks": Work(
        100_000_000,
        "PLANSIM_MAX_SWEEP_BLOCKS",
        "blocks walked",
        "the points' searches together (PLANSIM_MAX_PLAN_BLOCKS each): 1.5-4 hours on one core at some 7,000-20,000 "
        "per second, divided among --jobs or the cluster's workers",
    ),
    "finalist_tasks": Work(
        10_000_000,
        "PLANSIM_MAX_FINALIST_TASKS",
        "tasks and transfers",
        "2-9 min: the finalists' discrete-event runs together, some 20,000-100,000 simulated per second (Megatron-1T "
        "on 3,072 A100s, top 10: 9.0 million; gpt3-125m on 8, --top 1000: 2.0 million in 113 s)",
    ),
    "topology": Work(
        2_000_000,
        "PLANSIM_MAX_TOPOLOGY",
        "vertices and links",
        "about 1 GB and 40 s: the discrete-event engine's topology graph and link table hold some 500 bytes per "
        "vertex or link, built at some 50,000 per second (hardware --links -g 1048576: 5.4 million, 3 GB, 108 s)",
    ),
}


def _range_error(name: str, value: object, limit: Limit) -> PlansimError:
    kind = "a whole" if limit.integer else "a finite"
    return PlansimError(f"{_said(name, value)}: must be {kind} number from {limit.describe()}")


def whole(value: object, key: str, name: str | None = None) -> int:
    """``value`` as an int within ``LIMITS[key]``; a ``PlansimError`` naming ``name`` (default ``key``) otherwise."""
    limit, name = LIMITS[key], name or key
    if isinstance(value, bool):
        raise _range_error(name, value, limit)
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        if isinstance(value, float) and value.is_integer():
            n = int(value)
        else:
            raise _range_error(name, value, limit) from None
    if n < limit.low or (limit.low_open and n == limit.low):
        raise PlansimError(f"{_said(name, n)}: at least {_fmt(limit.low + (1 if limit.low_open else 0))}")
    if n > limit.high:
        unit = f" {limit.unit}" if limit.unit else ""
        raise PlansimError(f"{_said(name, n)}: at most {_fmt(limit.high)}{unit} ({limit.reason})")
    return n


def number(value: object, key: str, name: str | None = None) -> float:
    """``value`` as a finite float within ``LIMITS[key]``; a ``PlansimError`` naming ``name`` otherwise."""
    limit, name = LIMITS[key], name or key
    if isinstance(value, bool) or not isinstance(value, Real):
        raise _range_error(name, value, limit)
    x = float(value)
    if not math.isfinite(x):
        raise _range_error(name, value, limit)
    if x < limit.low or (limit.low_open and x == limit.low):
        least = ">" if limit.low_open else "at least"
        raise PlansimError(f"{_said(name, value)}: must be {least} {_fmt(limit.low)} ({limit.reason})")
    if x > limit.high:
        unit = f" {limit.unit}" if limit.unit else ""
        raise PlansimError(f"{_said(name, value)}: at most {_fmt(limit.high)}{unit} ({limit.reason})")
    return x


def field(key: str, **kwargs: Any) -> Any:
    """A pydantic ``Field`` bounded by ``LIMITS[key]`` (finite for floats), for the schemas."""
    limit = LIMITS[key]
    bounds: dict[str, Any] = {"gt" if limit.low_open else "ge": limit.low, "le": limit.high}
    if limit.integer:
        bounds = {k: int(v) for k, v in bounds.items()}
    else:
        bounds["allow_inf_nan"] = False
    return Field(**bounds, **kwargs)


def integral(value: Any) -> Any:
    """A schema's before-validator for whole-number fields: ``1e30`` read as the int it is, so the field's bound
    names the limit (pydantic alone says only that it cannot parse so large a number); a boolean or a string is
    refused (a ``ValueError`` the schema reports on the field's line), not read as 1 or 8 as pydantic would.

    >>> integral(1e30) == int(1e30), integral(2.5), integral(8)
    (True, 2.5, 8)
    >>> integral("8")
    Traceback (most recent call last):
    ...
    ValueError: must be a whole number, got the string "8": write it without quotes
    """
    if isinstance(value, bool):
        raise ValueError(f"must be a whole number, got the boolean {value}")
    if isinstance(value, str):
        quoted_number = value.strip().lstrip("+-").isdigit()
        fix = ": write it without quotes" if quoted_number else ""
        raise ValueError(f'must be a whole number, got the string "{shown(value)}"{fix}')
    return int(value) if isinstance(value, float) and value.is_integer() else value


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count), within ``LIMITS["jobs"]``:
    the default number of worker processes."""
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, int(LIMITS["jobs"].high)))


def work_bound(key: str) -> int:
    """The bound ``WORK[key]``, or its environment variable's value when set (a positive whole number)."""
    work = WORK[key]
    text = os.environ.get(work.env)
    if text is None or not text.strip():
        return work.default
    try:
        bound = int(text.strip().replace("_", ""))
    except ValueError:
        raise PlansimError(f"{work.env}={shown(text)}: expected a whole number such as {work.default}") from None
    if bound < 1:
        raise PlansimError(f"{work.env}={bound}: must be at least 1")
    return bound


def refuse_work(key: str, amount: int, subject: str, narrow: str) -> None:
    """A ``PlansimError`` when ``amount`` exceeds the bound of ``WORK[key]``: what, how much, how to narrow it and
    how to raise the bound."""
    bound = work_bound(key)
    if amount > bound:
        work = WORK[key]
        raise PlansimError(
            f"{subject}: about {amount:,} {work.what}, above the bound of {bound:,} ({work.env}): {narrow}, "
            f"or raise the bound ({work.env}={_round_up(amount)})"
        )


def _round_up(n: int) -> int:
    """``n`` rounded up to two significant digits (a bound to suggest)."""
    step = 10 ** max(len(str(n)) - 2, 0)
    return -(-n // step) * step
