"""The planner's search space: every strategy that can run a model on a cluster at a global batch, narrowed by the
user's constraints.

Dimensions (issue "the planner"): dp x tp x pp = GPUs (tp within a node unless ``allow_cross_node_tp``; tp divides
heads and kv heads; pp <= layers), micro-batch sizes dividing ``global_batch / dp``, the pipeline schedule (GPipe,
1F1B, interleaved with each valid virtual-stage count, ZB-H1), ZeRO 0-3, sequence parallelism, remat (none,
selective, full; ``milp`` is priced for the finalists only, see ``search``) and the data-parallel all-reduce.

Strategies that price identically are enumerated once (``canonical``): with one pipeline stage every schedule is
the same step, with dp = 1 ZeRO and the all-reduce algorithm change nothing, and under ZeRO >= 1 the gradient
reduction is a reduce-scatter whose algorithm is a ring unless the all-reduce is a butterfly
(``step.shard_algorithm``). Strategies that cannot run are not enumerated; ``check_strategy`` stays the judge.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from plansim.costs.collectives import ALLREDUCE_ALGORITHMS
from plansim.costs.remat_policies import REMAT_POLICIES
from plansim.errors import PlansimError
from plansim.hardware import Cluster
from plansim.schedules import SCHEDULES
from plansim.strategy import Strategy
from plansim.workload import ModelSpec

__all__ = ["SEARCH_REMAT", "Constraints", "candidates", "divisors"]

#: Remat policies every candidate is priced with (``milp`` is solved for the finalists only).
SEARCH_REMAT = ("none", "selective", "full")


@dataclass(frozen=True)
class Constraints:
    """What the user fixes or bounds (None: search every value). ``dp_algorithms`` and ``remat`` list the values
    to search."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    max_pp: int | None = None
    micro_batch: int | None = None
    max_micro_batch: int | None = None
    zero: int | None = None
    schedule: str | None = None
    sequence_parallel: bool | None = None
    remat: tuple[str, ...] = SEARCH_REMAT
    dp_algorithms: tuple[str, ...] = tuple(ALLREDUCE_ALGORITHMS)
    allow_cross_node_tp: bool = False
    dtype: str | None = None

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "max_pp", "micro_batch", "max_micro_batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise PlansimError(f"--{name.replace('_', '-')} {value}: must be at least 1")
        if self.zero is not None and self.zero not in (0, 1, 2, 3):
            raise PlansimError(f"--zero {self.zero}: choose 0, 1, 2 or 3")
        if self.schedule is not None and self.schedule not in SCHEDULES:
            raise PlansimError(f"--schedule {self.schedule}: choose one of {', '.join(SCHEDULES)}")
        if any(r in REMAT_POLICIES and REMAT_POLICIES[r].scheduled for r in self.remat):
            raise PlansimError("remat=milp is solved for the finalists only: leave it out of the searched policies")
        wrong = [r for r in self.remat if r not in REMAT_POLICIES]
        if wrong or not self.remat:
            raise PlansimError(f"remat policies {wrong or '(none)'}: choose among {', '.join(SEARCH_REMAT)}, or sqrt")
        bad = [a for a in self.dp_algorithms if a not in ALLREDUCE_ALGORITHMS]
        if bad or not self.dp_algorithms:
            raise PlansimError(f"dp algorithms {bad or '(none)'}: choose among {', '.join(ALLREDUCE_ALGORITHMS)}")


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def candidates(
    model: ModelSpec, cluster: Cluster, global_batch: int, c: Constraints = Constraints()
) -> Iterator[Strategy]:
    """Every distinct runnable strategy for ``model`` on ``cluster`` at ``global_batch`` within ``c``, in a fixed
    order (tp, pp, micro-batch, schedule, ZeRO, sequence parallel, remat, algorithm ascending)."""
    c = c or Constraints()
    n = cluster.num_gpus
    for tp in _tp_values(model, cluster, c):
        for pp in _pp_values(model, n // tp, c):
            dp = n // (tp * pp)
            if (c.dp is not None and dp != c.dp) or global_batch % dp:
                continue
            for mb in _micro_batches(global_batch // dp, c):
                m = global_batch // (dp * mb)
                for schedule, v in _schedules(model, pp, m, c):
                    for zero in _zero_values(dp, pp, c):
                        for sp in _sp_values(tp, c):
                            for remat in c.remat:
                                for algorithm in _algorithms(dp, zero, c):
                                    yield Strategy(
                                        dp=dp,
                                        tp=tp,
                                        pp=pp,
                                        micro_batch=mb,
                                        global_batch=global_batch,
                                        schedule=schedule,
                                        virtual_stages=v,
                                        zero=zero,
                                        sequence_parallel=sp,
                                        remat=remat,
                                        dp_algorithm=algorithm,
                                        dtype=c.dtype,
                                    )


def _tp_values(model: ModelSpec, cluster: Cluster, c: Constraints) -> list[int]:
    out = []
    for tp in divisors(cluster.num_gpus):
        if c.tp is not None and tp != c.tp:
            continue
        if tp > cluster.gpus_per_node and not c.allow_cross_node_tp:
            continue
        if model.family in ("gpt", "llama") and (model.heads % tp or model.kv_heads % tp):
            continue
        if model.family == "cnn" and tp > 1:
            continue
        out.append(tp)
    return out


def _pp_values(model: ModelSpec, rest: int, c: Constraints) -> list[int]:
    top = min(model.layers, c.max_pp or model.layers)
    return [pp for pp in divisors(rest) if pp <= top and (c.pp is None or pp == c.pp)]


def _micro_batches(per_replica: int, c: Constraints) -> list[int]:
    return [
        mb
        for mb in divisors(per_replica)
        if (c.micro_batch is None or mb == c.micro_batch) and (c.max_micro_batch is None or mb <= c.max_micro_batch)
    ]


def _schedules(model: ModelSpec, pp: int, m: int, c: Constraints) -> list[tuple[str, int]]:
    """(schedule, virtual stages) from the registry: one chunk per stage first, then every v that a schedule with
    model chunks allows (Megatron-LM's rules). One pipeline stage runs every schedule alike, so it gets the default
    schedule only."""
    wanted = [name for name in SCHEDULES if c.schedule in (None, name)]
    if pp == 1:
        default = Strategy.model_fields["schedule"].default
        return [(default, 1)] if any(not SCHEDULES[name].model_chunks for name in wanted) else []
    out = [(name, 1) for name in wanted if not SCHEDULES[name].model_chunks]
    for name in (n for n in wanted if SCHEDULES[n].model_chunks and m % pp == 0):
        out += [(name, v) for v in range(2, model.layers // pp + 1) if model.layers % (pp * v) == 0]
    return out


def _zero_values(dp: int, pp: int, c: Constraints) -> list[int]:
    if dp == 1:  # nothing to shard: every stage is ZeRO-0
        return [0] if c.zero in (None, 0) else []
    values = [0, 1] if pp > 1 else [0, 1, 2, 3]  # ZeRO-2/3 with pipelines: not supported (check_strategy)
    return [z for z in values if c.zero is None or z == c.zero]


def _sp_values(tp: int, c: Constraints) -> list[bool]:
    values = [False, True] if tp > 1 else [False]
    return [v for v in values if c.sequence_parallel is None or v == c.sequence_parallel]


def _algorithms(dp: int, zero: int, c: Constraints) -> list[str]:
    if dp == 1:
        return [c.dp_algorithms[0]]
    wanted = [a for a in c.dp_algorithms if a != "butterfly" or dp & (dp - 1) == 0]
    if zero >= 1:  # sharded collectives run as rings, or as butterflies with a butterfly all-reduce: one of each
        ring_like = [a for a in wanted if a != "butterfly"][:1]
        wanted = ring_like + (["butterfly"] if "butterfly" in wanted else [])
    return wanted
