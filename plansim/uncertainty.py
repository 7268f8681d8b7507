"""The uncertain inputs of a cluster's profiles: what each is, its range, and the cluster with it set to a value.

Four inputs carry most of a step model's uncertainty, and each has a range in the hardware profiles (``uncertainty``
sections, from the spread of the cited micro-benchmark sources):

- ``inter_node_efficiency`` (node profile): the fraction of the NICs' line rate that collectives across nodes reach
  (``nics.efficiency``);
- ``gemm_efficiency`` (GPU profile): a large GEMM's fraction of the training dtype's peak, the top of the
  ``efficiency.matmul`` curve; a value scales the whole curve (capped at 1);
- ``interference`` (GPU profile): how many times longer the overlap measurement's kernel takes beside its collective
  (``overlapped_s / alone_s``), from which ``plansim.costs.interference`` derives compute's slowdown beside any
  collective; a GPU without a measurement of its own varies the reference GPU's;
- ``gpu_to_gpu_cv`` (GPU profile): the chip-to-chip coefficient of variation, whose slowest GPU the step waits for
  (``plansim.costs.stragglers``).

One more input is the model's, not the profiles': a mixture of experts' routing imbalance (``moe_imbalance``,
``MODEL_INPUTS``), from balanced to ``IMBALANCE_HIGH`` (or the model's own value where higher). A higher value slows
the step (``tests/test_moe_imbalance.py``), so its worse end is pinned in every worst corner.

An input that a measured kernel profile (``hardware_profiles/measured/``) prices instead of the GPU profile (its GEMM
table, its overlap section) is left out: the measurement replaces the published spread. A profile without a range
for an input holds it at the profile's value. Every input moves the step time one way (``worse``: lower or higher
values slow it): a faster network finishes a collective sooner, and the HBM its bytes load beside compute is spread
over the time the call runs (``plansim.costs.interference.paced``), so no step is slower with the higher inter-node
efficiency (``tests/test_monotone.py``). The worst case over the box is therefore its value at ``worst_corners``,
every input at its worse end; ``tests/test_robust.py`` checks that against every corner. An input could be marked
not ``monotone``, and the worst case would try both its ends.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Generic, TypeVar

from plansim.errors import PlansimError
from plansim.hardware import Cluster
from plansim.hardware.schema import GPUSpec, OverlapMeasurement

if TYPE_CHECKING:
    from plansim.costs.kernels import KernelTable
    from plansim.workload import ModelSpec

__all__ = [
    "IMBALANCE_HIGH",
    "INPUTS",
    "MODEL_INPUTS",
    "UncertainInput",
    "corners",
    "input_named",
    "model_nominal",
    "model_ranges",
    "model_search_bounds",
    "model_worst",
    "nominal",
    "perturbed",
    "ranges",
    "search_bounds",
    "with_model_inputs",
    "worst",
    "worst_corners",
]


#: What an uncertain input is read from and set on: a cluster (the profiles' inputs) or a model (the model's).
Subject = TypeVar("Subject")


@dataclass(frozen=True)
class UncertainInput(Generic[Subject]):
    """One uncertain input: its key in the profiles' ``uncertainty`` sections (or the model's field), its words, which
    way slows the step (``worse``: -1 lower values, +1 higher) and whether always (``monotone``; else the worst case
    tries both ends), the widest values a break-even search may try (``bounds``), how a value reads (``show``), and
    how to read it, set it, give its [low, high] range (None: none given) and say whether it applies, on its subject
    (a ``Cluster`` or a ``ModelSpec``)."""

    name: str
    label: str
    worse: int
    monotone: bool
    bounds: tuple[float, float]
    show: Callable[[float], str]
    value: Callable[[Subject], float]
    apply: Callable[[Subject, float], Subject]
    given_range: Callable[[Subject], tuple[float, float] | None]
    applies: Callable[[Subject], bool]


def _percent(x: float) -> str:
    """A fraction as a percentage to three significant figures, whole percentages plain.

    >>> _percent(0.96), _percent(0.848), _percent(0.0408), _percent(0.0)
    ('96%', '84.8%', '4.08%', '0%')
    """
    if abs(x * 100 - round(x * 100)) < 1e-9:
        return f"{x:.0%}"
    return f"{float(f'{x * 100:.3g}'):g}%"


def _times(x: float) -> str:
    """A slowdown to four significant figures.

    >>> _times(2.5), _times(1.7627118)
    ('2.5x', '1.763x')
    """
    return f"{x:.4g}x"


def _with_gpu(cluster: Cluster, gpu: GPUSpec) -> Cluster:
    return Cluster(cluster.node, gpu, cluster.num_gpus)


# --- inter-node efficiency -------------------------------------------------------------------------------------------


def _inter_value(c: Cluster) -> float:
    return c.node.nics.efficiency


def _inter_apply(c: Cluster, v: float) -> Cluster:
    nics = c.node.nics.model_copy(update={"efficiency": v})
    return Cluster(c.node.model_copy(update={"nics": nics}), c.gpu, c.num_gpus)


def _inter_range(c: Cluster) -> tuple[float, float] | None:
    return c.node.uncertainty.inter_node_efficiency if c.node.uncertainty else None


def _inter_applies(c: Cluster) -> bool:
    return c.num_nodes > 1  # one node sends nothing over its NICs


# --- GEMM efficiency -------------------------------------------------------------------------------------------------


def _gemm_value(c: Cluster) -> float:
    return max(f for _, f in c.gpu.efficiency.matmul)


def _gemm_apply(c: Cluster, v: float) -> Cluster:
    scale = v / _gemm_value(c)
    curve = tuple((size, min(1.0, f * scale)) for size, f in c.gpu.efficiency.matmul)
    efficiency = c.gpu.efficiency.model_copy(update={"matmul": curve})
    return _with_gpu(c, c.gpu.model_copy(update={"efficiency": efficiency}))


def _gemm_range(c: Cluster) -> tuple[float, float] | None:
    return c.gpu.uncertainty.gemm_efficiency if c.gpu.uncertainty else None


def _gemm_applies(c: Cluster) -> bool:
    table = _table(c.gpu.name)
    return table is None or not any(key[0] == "gemm" for key in table.points)


# --- interference ----------------------------------------------------------------------------------------------------


def _measurement(gpu: GPUSpec) -> OverlapMeasurement:
    """The overlap measurement the interference model reads for ``gpu``: its own, else the reference GPU's with the
    SMs and bandwidth it was measured at (``plansim.costs.interference``)."""
    if gpu.overlap is not None:
        return gpu.overlap
    from plansim.costs.interference import _REFERENCE_GPU
    from plansim.hardware import load_gpu

    ref = load_gpu(_REFERENCE_GPU)
    assert ref.overlap is not None
    return ref.overlap.model_copy(update={"measured_sm_count": ref.sm_count, "measured_hbm_Bps": ref.hbm_bandwidth_Bps})


def _interference_value(c: Cluster) -> float:
    m = _measurement(c.gpu)
    return m.overlapped_s / m.alone_s


def _interference_apply(c: Cluster, v: float) -> Cluster:
    m = _measurement(c.gpu)
    return _with_gpu(c, c.gpu.model_copy(update={"overlap": m.model_copy(update={"overlapped_s": m.alone_s * v})}))


def _interference_range(c: Cluster) -> tuple[float, float] | None:
    return c.gpu.uncertainty.interference if c.gpu.uncertainty else None


def _interference_applies(c: Cluster) -> bool:
    table = _table(c.gpu.name)
    return table is None or table.overlap is None


# --- GPU-to-GPU variation --------------------------------------------------------------------------------------------


def _cv_value(c: Cluster) -> float:
    return c.gpu.gpu_to_gpu_cv


def _cv_apply(c: Cluster, v: float) -> Cluster:
    return _with_gpu(c, c.gpu.model_copy(update={"gpu_to_gpu_cv": v}))


def _cv_range(c: Cluster) -> tuple[float, float] | None:
    return c.gpu.uncertainty.gpu_to_gpu_cv if c.gpu.uncertainty else None


def _cv_applies(c: Cluster) -> bool:
    return c.num_gpus > 1  # one GPU waits for no slower one


def _table(gpu_name: str) -> KernelTable | None:
    from plansim.costs.kernels import load_kernel_table

    return load_kernel_table(gpu_name)


#: Every uncertain input, in the order reports list them.
INPUTS: dict[str, UncertainInput[Cluster]] = {
    u.name: u
    for u in (
        UncertainInput(
            "inter_node_efficiency", "inter-node efficiency", -1, True, (0.05, 1.0), _percent,
            _inter_value, _inter_apply, _inter_range, _inter_applies,
        ),
        UncertainInput(
            "gemm_efficiency", "GEMM efficiency", -1, True, (0.05, 1.0), _percent,
            _gemm_value, _gemm_apply, _gemm_range, _gemm_applies,
        ),
        UncertainInput(
            "interference", "compute/communication interference", +1, True, (1.0, 4.0), _times,
            _interference_value, _interference_apply, _interference_range, _interference_applies,
        ),
        UncertainInput(
            "gpu_to_gpu_cv", "GPU-to-GPU variation", +1, True, (0.0, 0.2), _percent,
            _cv_value, _cv_apply, _cv_range, _cv_applies,
        ),
    )
}  # fmt: skip


def nominal(cluster: Cluster) -> dict[str, float]:
    """Each input that applies to ``cluster`` at the profiles' value."""
    return {name: u.value(cluster) for name, u in INPUTS.items() if u.applies(cluster)}


def ranges(cluster: Cluster) -> dict[str, tuple[float, float]]:
    """Each input that applies to ``cluster`` and its [low, high] range (the profile's value at both ends where the
    profile gives no range)."""
    out = {}
    for name, value in nominal(cluster).items():
        given = INPUTS[name].given_range(cluster)
        out[name] = (float(given[0]), float(given[1])) if given is not None else (value, value)
    return out


def worst(cluster: Cluster) -> dict[str, float]:
    """The corner of the box with every input at the end that usually slows the step (``worse``)."""
    return {name: (high if INPUTS[name].worse > 0 else low) for name, (low, high) in ranges(cluster).items()}


def worst_corners(cluster: Cluster) -> list[dict[str, float]]:
    """The corners of the box a strategy's worst case is among: each ``monotone`` input at its worse end, the others
    at both ends (their product). The step time's maximum over these equals its maximum over every corner as long
    as the monotone inputs are monotone, which ``tests/test_robust.py`` checks against all corners."""
    pinned = worst(cluster)
    box = ranges(cluster)
    free = [name for name in box if not INPUTS[name].monotone and box[name][0] != box[name][1]]
    out = []
    for ends in itertools.product(*(box[name] for name in free)):
        out.append({**pinned, **dict(zip(free, ends, strict=True))})
    return out


def corners(cluster: Cluster) -> Iterator[dict[str, float]]:
    """Every corner of the box of ranges (2^n for n inputs that apply; an input without a range counts once)."""
    box = ranges(cluster)
    ends = [sorted({low, high}) for low, high in box.values()]
    for values in itertools.product(*ends):
        yield dict(zip(box, values, strict=True))


def search_bounds(cluster: Cluster, name: str) -> tuple[float, float]:
    """The values input ``name`` may take on ``cluster``: its ``bounds``, widened to hold the profile's value and
    range (a profile may go beyond them)."""
    u = INPUTS[name]
    value = u.value(cluster)
    given = u.given_range(cluster) or (value, value)
    return min(u.bounds[0], given[0], value), max(u.bounds[1], given[1], value)


def perturbed(cluster: Cluster, values: Mapping[str, float]) -> Cluster:
    """``cluster`` with each named input set to its value (the others as profiled).

    >>> from plansim.hardware import load_hardware
    >>> c = perturbed(load_hardware("dgx-a100", gpus=16), {"inter_node_efficiency": 0.8})
    >>> c.node.nics.efficiency, c.group_link(2, 8).bandwidth_Bps / 1e9
    (0.8, 20.0)
    """
    return _perturbed(cluster, tuple(sorted(values.items())))


@lru_cache(maxsize=256)
def _perturbed(cluster: Cluster, values: tuple[tuple[str, float], ...]) -> Cluster:
    out = cluster
    for name, value in values:
        u = INPUTS.get(name)
        if u is None:
            raise PlansimError(f"uncertain input '{name}': choose among {', '.join(INPUTS)}")
        low, high = search_bounds(cluster, name)
        if not low <= value <= high:
            raise PlansimError(f"{u.label} {u.show(value)}: outside {u.show(low)} to {u.show(high)}")
        if value != u.value(out):
            out = u.apply(out, value)
    return out


# --- the model's uncertain inputs ------------------------------------------------------------------------------------

#: The top of the routing imbalance's range. ASSUMPTION: no published distribution of the busiest expert-parallel
#: rank's load was found; 1.5 lies within the capacity factors of 1-2 that GShard and Switch size expert buffers with
#: so that few tokens are dropped (Lepikhin et al. 2021 sec 2.2; Fedus et al. 2022 sec 2.2), loads their authors
#: expected a busy expert to reach. The nominal value is the model's (``--moe-imbalance``).
IMBALANCE_HIGH = 1.5


def _imbalance_apply(m: ModelSpec, v: float) -> ModelSpec:
    from plansim.workload import with_moe_imbalance

    return with_moe_imbalance(m, v, "moe_imbalance")


#: The model's uncertain inputs: a mixture of experts' routing imbalance (``plansim.workload.moe.Routing``).
MODEL_INPUTS: dict[str, UncertainInput[ModelSpec]] = {
    u.name: u
    for u in (
        UncertainInput(
            "moe_imbalance", "routing imbalance", +1, True, (1.0, 4.0), _times,
            lambda m: m.moe_imbalance, _imbalance_apply,
            lambda m: (1.0, max(IMBALANCE_HIGH, m.moe_imbalance)), lambda m: m.moe_layers > 0,
        ),
    )
}  # fmt: skip


def model_nominal(model: ModelSpec) -> dict[str, float]:
    """Each model input that applies to ``model`` at its value."""
    return {name: u.value(model) for name, u in MODEL_INPUTS.items() if u.applies(model)}


def model_ranges(model: ModelSpec) -> dict[str, tuple[float, float]]:
    """Each model input that applies to ``model`` and its [low, high] range."""
    return {name: _model_range(model, name) for name in model_nominal(model)}


def _model_range(model: ModelSpec, name: str) -> tuple[float, float]:
    """Model input ``name``'s range on ``model`` (every model input gives one)."""
    given = MODEL_INPUTS[name].given_range(model)
    assert given is not None, f"model input {name} gives its range"
    return given


def model_worst(model: ModelSpec) -> dict[str, float]:
    """Each model input at its worse end (every one is monotone)."""
    return {n: (high if MODEL_INPUTS[n].worse > 0 else low) for n, (low, high) in model_ranges(model).items()}


def model_search_bounds(model: ModelSpec, name: str) -> tuple[float, float]:
    """The values model input ``name`` may take in a break-even search: its ``bounds`` widened to hold its range."""
    u = MODEL_INPUTS[name]
    low, high = _model_range(model, name)
    return min(u.bounds[0], low), max(u.bounds[1], high)


def with_model_inputs(model: ModelSpec, values: Mapping[str, float]) -> ModelSpec:
    """``model`` with each named model input set (names of ``INPUTS``, the profiles', are skipped).

    >>> from plansim.workload import load_model
    >>> with_model_inputs(load_model("mixtral-8x7b"), {"moe_imbalance": 1.5, "gemm_efficiency": 0.7}).moe_imbalance
    1.5
    """
    for name, value in values.items():
        if name in MODEL_INPUTS:
            model = MODEL_INPUTS[name].apply(model, value)
    return model


def input_named(name: str) -> UncertainInput[Cluster] | UncertainInput[ModelSpec]:
    """An uncertain input by name: a profile's (``INPUTS``) or the model's (``MODEL_INPUTS``)."""
    return INPUTS[name] if name in INPUTS else MODEL_INPUTS[name]
