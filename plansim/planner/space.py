"""The planner's search space: every strategy that can run a model on a cluster at a global batch, narrowed by the
user's constraints.

Dimensions (issue "the planner"): dp x tp x cp x pp = GPUs (tp within a node unless ``allow_cross_node_tp``; tp divides
heads and kv heads; pp <= layers), micro-batch sizes dividing ``global_batch / dp``, the pipeline schedule (GPipe,
1F1B, interleaved with each valid virtual-stage count, ZB-H1), ZeRO 0-3 (under ``fsdp`` ZeRO-2/3 also hybrid-sharded
within each node: HSDP), sequence parallelism (and with it Megatron-LM's
``--tp-comm-overlap``), remat (the policies the framework runs, its ``remat_policies`` rule: Megatron-LM none,
selective, full; ``milp`` is priced for the finalists only, see ``search``) and the data-parallel all-reduce among
those the framework's library runs (its ``collective_library`` rule: NCCL's entries of the registry; by default
NCCL's own pick, ``nccl``). The course's algorithms (tree, butterfly, naive, parameter server, hierarchical) run in
no framework: ``simulate`` and ``compare`` price them as what-ifs, and asking the planner for one is refused.

Strategies that price identically are enumerated once (``canonical``): with one pipeline stage every schedule is
the same step, with dp = 1 ZeRO and the all-reduce algorithm change nothing, and under ZeRO >= 1 the gradient
reduction is a reduce-scatter whose algorithm is the all-reduce entry's ``sharded_with`` (a ring beside ``ring``,
NCCL's pick beside ``nccl``: ``step.prepare.shard_algorithm``). Strategies that cannot run are not enumerated;
``check_strategy`` stays the judge.

``Constraints`` are the user's (or a mapping of their fields; ``headroom``: the memory a plan must leave free).
``count_candidates`` and ``search_work`` run the same loops without building a strategy, so that ``plan`` refuses a
space above its work bounds (``plansim.limits.WORK``, ``PLANSIM_MAX_CANDIDATES``) before pricing any of it.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from plansim.arguments import choice, flag, names, type_name
from plansim.costs.collectives import ALLREDUCE_ALGORITHMS
from plansim.costs.remat_policies import REMAT_POLICIES
from plansim.errors import PlansimError, shown
from plansim.hardware import Cluster
from plansim.limits import LIMITS, number, whole
from plansim.pipeline.schedules import SCHEDULES
from plansim.step.result import THIN_MARGIN
from plansim.strategy.checks import fp8_problems
from plansim.strategy.frameworks import framework_names, library_algorithms, load_framework, modelled_zero_stages
from plansim.strategy.mesh import degree_splits, grad_group_size, span
from plansim.strategy.schema import CP_ALGORITHMS, DTYPES, OFFLOAD_KINDS, Strategy
from plansim.units import GB, parse_bytes
from plansim.workload import ModelSpec
from plansim.workload.families import axis_problems, family_of
from plansim.workload.transformer import heads_swap_problems

__all__ = [
    "INTERLEAVED_PER_BLOCK",
    "OFFLOAD_LAYER_SHARES",
    "Constraints",
    "SearchWork",
    "candidates",
    "count_candidates",
    "divisors",
    "headroom_of",
    "search_work",
]


@dataclass(frozen=True)
class Constraints:
    """What the user fixes or bounds (None: search every value). ``dp_algorithms`` and ``remat`` list the values
    to search (``remat`` None: what each framework runs, its ``remat_policies`` rule)."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    #: the context-parallel degree; None searches it where the sequence is long (``CP_FROM_SEQ_LEN``), else cp = 1
    cp: int | None = None
    #: context parallelism's form (``ring``, ``all_to_all``); None: each framework's default
    cp_algorithm: str | None = None
    #: expert parallelism's degree (a mixture-of-experts model's experts split over ``ep`` ranks); None searches every
    #: divisor of the experts the framework runs there (``_experts``); a model without experts has ep = 1
    ep: int | None = None
    #: tensor parallelism inside the experts; None searches the framework's default and 1 (``_experts``)
    etp: int | None = None
    max_pp: int | None = None
    micro_batch: int | None = None
    max_micro_batch: int | None = None
    zero: int | None = None
    schedule: str | None = None
    sequence_parallel: bool | None = None
    #: Megatron-LM's --tp-comm-overlap: True searches only it (where the framework runs it), False never; None
    #: searches the space without it and tries it on the finalists (``search``)
    tp_comm_overlap: bool | None = None
    remat: tuple[str, ...] | None = None
    #: the all-reduce algorithms to search, each one the framework's library runs (``frameworks.library_algorithms``:
    #: NCCL's); None: those of them that are not ``pinned`` (``nccl``, NCCL's own pick per call; ``ring``,
    #: NCCL_ALGO=Ring, prices as ``nccl`` wherever NCCL picks the ring, so searching both would price most
    #: configurations twice: name it to search it too). The course's algorithms run in no framework: ``compare``
    #: prices them as what-ifs
    dp_algorithms: tuple[str, ...] | None = None
    allow_cross_node_tp: bool = False
    #: the training dtypes to search (``"bf16,fp8"``, a list, or one); None: the GPU's default (bf16, else fp16).
    #: FP8 only where asked: it changes the numerics, which is the user's call (``--dtype bf16,fp8``)
    dtype: str | tuple[str, ...] | None = None
    #: the training framework whose rules the candidates follow (``strategy.frameworks``), or ``all`` to search each
    framework: str = "megatron"
    #: the fraction of the GPU's memory a plan must leave free at its peak (``Result.memory_margin``); a candidate
    #: that fits with less is rejected. Default ``THIN_MARGIN`` (5 %): what the memory model leaves out (the CUDA
    #: context's lazily loaded kernels, the framework's other communicators, fragmentation) is of that order on an
    #: 80 GB GPU (``plansim.step.result``)
    headroom: float = THIN_MARGIN  # also read from text: "5%", "0.05" or a size, "4GB" (``headroom_of``)
    #: a headroom given in bytes (``--headroom 4GB``), made a fraction of the GPU's memory by ``for_gpu``
    headroom_bytes: float | None = None
    #: what the candidates may offload to host memory (``"optimizer,activations"``, a list, or ``all``); each is
    #: searched beside no offloading in the combinations the framework runs (its ``offload`` rule). None: nothing
    #: is offloaded (it trades step time for memory: the user's call, ``--offload``)
    offload: str | tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        """Check every field at the boundary (``plansim.limits`` for the numbers); a single string is accepted
        for ``remat`` and ``dp_algorithms`` as a list of one."""
        for name, key in _DEGREES.items():
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, whole(value, key, f"--{name.replace('_', '-')}"))
        if self.zero is not None and (isinstance(self.zero, bool) or self.zero not in (0, 1, 2, 3)):
            raise PlansimError(f"--zero {shown(self.zero)}: choose 0, 1, 2 or 3")
        if self.schedule is not None:
            choice(self.schedule, SCHEDULES, "--schedule")
        if self.dtype is not None:
            text = self.dtype
            parts = tuple(d.strip() for d in text.split(",") if d.strip()) if isinstance(text, str) else text
            wanted = names(parts, "--dtype")
            if not wanted:
                raise PlansimError(f"--dtype (none): choose among {', '.join(DTYPES)}, comma-separated")
            for d in wanted:
                choice(d, DTYPES, "--dtype")
            object.__setattr__(self, "dtype", tuple(dict.fromkeys(wanted)))
        if self.cp_algorithm is not None:
            choice(self.cp_algorithm, CP_ALGORITHMS, "--cp-algorithm")
        if self.offload is not None:
            self._check_offload()
        choice(self.framework, [*framework_names(), "all"], "--framework")
        if self.schedule is not None and not any(
            self.schedule in load_framework(n).rules.schedules.value for n in self.frameworks
        ):
            runs = [n for n in framework_names() if self.schedule in load_framework(n).rules.schedules.value]
            title = load_framework(self.framework).title if self.framework != "all" else "no framework"
            raise PlansimError(
                f"--schedule {self.schedule}: {title} does not run it (frameworks/{self.framework}.yaml): use "
                f"--framework {' or '.join(runs)}, or another --schedule"
            )
        for name in ("sequence_parallel", "tp_comm_overlap", "allow_cross_node_tp"):
            value = getattr(self, name)
            if value is not None or name == "allow_cross_node_tp":
                flag(value, f"constraints.{name}")
        if self.tp_comm_overlap and self.sequence_parallel is False:
            raise PlansimError(
                "--tp-comm-overlap needs sequence parallelism: leave sequence_parallel=False out of the constraints"
            )
        if self.tp_comm_overlap and all(load_framework(n).rules.tp_comm_overlap.value is None for n in self.frameworks):
            runs = [n for n in framework_names() if load_framework(n).rules.tp_comm_overlap.value is not None]
            title = load_framework(self.framework).title if self.framework != "all" else "no framework"
            raise PlansimError(
                f"--tp-comm-overlap: {title} does not run it (frameworks/{self.framework}.yaml): use --framework "
                f"{' or '.join(runs)}, or leave --tp-comm-overlap out"
            )
        if self.remat is not None:
            self._check_remat(names(self.remat, "--remat"))
        if self.dp_algorithms is not None:
            object.__setattr__(self, "dp_algorithms", names(self.dp_algorithms, "constraints.dp_algorithms"))
            self._check_algorithms(self.dp_algorithms)
        self._check_headroom()

    def _check_headroom(self) -> None:
        """``headroom`` as a fraction (text read by ``headroom_of``); a size is kept in ``headroom_bytes`` until
        ``for_gpu`` knows the GPU's memory."""
        value: object = self.headroom
        if isinstance(value, str):
            value, size = headroom_of(value)
            if size is not None:
                object.__setattr__(self, "headroom_bytes", size)
        if self.headroom_bytes is not None:
            object.__setattr__(self, "headroom_bytes", number(self.headroom_bytes, "headroom_bytes", "--headroom"))
        object.__setattr__(self, "headroom", number(value, "headroom", "--headroom"))

    def _check_offload(self) -> None:
        """``offload`` as a tuple of kinds (``all``: every kind)."""
        text = self.offload
        parts = tuple(k.strip() for k in text.split(",") if k.strip()) if isinstance(text, str) else text
        wanted = names(parts, "--offload")
        if wanted == ("all",):
            wanted = OFFLOAD_KINDS
        wrong = [k for k in wanted if k not in OFFLOAD_KINDS]
        if wrong or not wanted:
            raise PlansimError(
                f"--offload {shown(wrong[0]) if wrong else '(none)'}: choose among {', '.join(OFFLOAD_KINDS)}, "
                "comma-separated, or all"
            )
        object.__setattr__(self, "offload", tuple(dict.fromkeys(wanted)))

    def for_gpu(self, memory_bytes: float) -> Constraints:
        """These constraints with a headroom given in bytes made the fraction of ``memory_bytes`` it is."""
        if self.headroom_bytes is None:
            return self
        if self.headroom_bytes >= memory_bytes * LIMITS["headroom"].high:
            raise PlansimError(
                f"--headroom {self.headroom_bytes / GB:g}GB: at most {LIMITS['headroom'].high:.0%} of the GPU's "
                f"{memory_bytes / GB:.1f} GB"
            )
        return dataclasses.replace(self, headroom=self.headroom_bytes / memory_bytes, headroom_bytes=None)

    def dtypes(self, cluster: Cluster) -> tuple[str | None, ...]:
        """The training dtypes searched on ``cluster``: ``dtype``, or (None) the GPU's default; a dtype the GPU has
        no peak for is refused in one line."""
        if self.dtype is None:
            return (None,)
        lacking = [d for d in self.dtype if not cluster.gpu.supports(d)]
        if lacking:
            has = [d for d in DTYPES if cluster.gpu.supports(d)]
            raise PlansimError(
                f"--dtype {lacking[0]}: the {cluster.gpu.name} has no {lacking[0]} tensor cores (its profile gives no "
                f"peak): choose among {', '.join(has)}"
            )
        return tuple(self.dtype)

    def _check_remat(self, wanted: tuple[str, ...]) -> None:
        """Each requested remat policy is a registry entry, not ``scheduled``, that some searched framework runs."""
        object.__setattr__(self, "remat", wanted)
        if any(r in REMAT_POLICIES and REMAT_POLICIES[r].scheduled for r in wanted):
            raise PlansimError("remat=milp is solved for the finalists only: leave it out of the searched policies")
        wrong = [r for r in wanted if r not in REMAT_POLICIES]
        if wrong or not wanted:
            runs = sorted({p for n in framework_names() for p in load_framework(n).rules.remat_policies.value})
            raise PlansimError(f"remat policies {wrong or '(none)'}: choose among {', '.join(runs)}")
        for r in wanted:
            if not any(r in load_framework(n).rules.remat_policies.value for n in self.frameworks):
                runs = [n for n in framework_names() if r in load_framework(n).rules.remat_policies.value]
                title = load_framework(self.framework).title if self.framework != "all" else "no framework"
                instead = f"use --framework {' or '.join(runs)}, or " if runs else ""
                raise PlansimError(
                    f"--remat {r}: {title} does not run it (frameworks/{self.framework}.yaml: remat_policies): "
                    f"{instead}price it as a what-if with plansim compare -s '...,remat={r}'"
                )

    def remats(self, framework: str) -> tuple[str, ...]:
        """The remat policies searched under ``framework``: those of ``remat`` it runs (its ``remat_policies``
        rule), or (None) all it runs."""
        runs = load_framework(framework).rules.remat_policies.value
        return runs if self.remat is None else tuple(r for r in self.remat if r in runs)

    def _check_algorithms(self, wanted: tuple[str, ...]) -> None:
        """Each requested all-reduce is a registry entry that every searched framework's library runs."""
        bad = [a for a in wanted if a not in ALLREDUCE_ALGORITHMS]
        if bad or not wanted:
            raise PlansimError(f"dp algorithms {bad or '(none)'}: choose among {', '.join(ALLREDUCE_ALGORITHMS)}")
        for name in self.frameworks:
            runs = library_algorithms(name)
            foreign = [a for a in wanted if a not in runs]
            if foreign:
                profile = load_framework(name)
                library = profile.rules.collective_library.value.upper()
                raise PlansimError(
                    f"--dp-algorithms {shown(foreign[0])}: {profile.title} runs its collectives in {library} "
                    f"(frameworks/{name}.yaml: collective_library), which does not run it: search "
                    f"{' or '.join(runs)}, or price it as a what-if with plansim compare -s '...,dp_algorithm="
                    f"{shown(foreign[0])}'"
                )

    def algorithms(self, framework: str) -> tuple[str, ...]:
        """The all-reduce algorithms searched under ``framework``: ``dp_algorithms``, or (None) those its library
        runs that are not ``pinned`` (see the field)."""
        if self.dp_algorithms is not None:
            return self.dp_algorithms
        return tuple(a for a in library_algorithms(framework) if not ALLREDUCE_ALGORITHMS[a].pinned)

    @property
    def frameworks(self) -> tuple[str, ...]:
        """The frameworks searched: ``framework``, or every profile for ``all``."""
        return tuple(framework_names()) if self.framework == "all" else (self.framework,)

    @classmethod
    def of(cls, value: object) -> Constraints:
        """``value`` as Constraints: Constraints, None (no constraints) or a mapping of its fields
        (``{"tp": 2}``); anything else, or an unknown field, is a ``PlansimError``."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise PlansimError(
                f"constraints: expected Constraints(...) or a mapping such as {{'tp': 2}}, got {type_name(value)}"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = [str(k) for k in value if k not in known]
        if unknown:
            raise PlansimError(f"constraints: unknown field {shown(unknown[0])}: use {', '.join(sorted(known))}")
        return cls(**value)


def headroom_of(text: str) -> tuple[float, float | None]:
    """A headroom as users write it: a fraction (``0.05``) or a percentage (``5%``), as (fraction, None); or a size
    (``4GB``, ``512MiB``), as (0, bytes). Checked against its range by ``Constraints``.

    >>> headroom_of("5%"), headroom_of("0.1"), headroom_of("4GB")
    ((0.05, None), (0.1, None), (0.0, 4000000000.0))
    """
    t = text.strip()
    try:
        if t.endswith("%"):
            return float(t[:-1]) / 100, None
        if re.fullmatch(r"[0-9.eE+-]+", t):
            return float(t), None
        return 0.0, parse_bytes(t)
    except ValueError:
        raise PlansimError(
            f"--headroom {shown(text)}: write a fraction (0.05), a percentage (5%) or a size (4GB)"
        ) from None


#: Constraint fields that are parallel degrees or batch sizes -> their range in ``plansim.limits``.
_DEGREES = {"tp": "tp", "pp": "pp", "dp": "dp", "cp": "cp", "ep": "ep", "etp": "etp", "max_pp": "pp",
            "micro_batch": "micro_batch", "max_micro_batch": "micro_batch"}  # fmt: skip


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending, from its prime factors (trial division up to the square root of what is
    left, so smooth numbers such as batch sizes factor at once; the callers bound ``n``: ``plansim.limits``).

    >>> divisors(12), divisors(1), divisors(97)
    ([1, 2, 3, 4, 6, 12], [1], [1, 97])
    >>> len(divisors(2**62))
    63
    """
    if n < 1:
        raise PlansimError(f"divisors of {n}: a positive whole number is needed")
    found = [1]
    rest, p = n, 2
    while p * p <= rest:
        power = 0
        while rest % p == 0:
            rest //= p
            power += 1
        if power:
            found = [d * p**k for d in found for k in range(power + 1)]
        p += 1 if p == 2 else 2
    if rest > 1:
        found += [d * rest for d in found]
    return sorted(found)


def candidates(
    model: ModelSpec, cluster: Cluster, global_batch: int, c: Constraints = Constraints()
) -> Iterator[Strategy]:
    """Every distinct runnable strategy for ``model`` on ``cluster`` at ``global_batch`` within ``c``, in a fixed
    order (tp, pp, micro-batch, schedule, ZeRO, sequence parallel, remat, algorithm ascending)."""
    c = c or Constraints()
    for framework in c.frameworks:
        yield from _candidates(model, cluster, global_batch, c, framework)


def _candidates(
    model: ModelSpec, cluster: Cluster, global_batch: int, c: Constraints, framework: str
) -> Iterator[Strategy]:
    dtypes = _dtypes(model, cluster, c, framework)
    for tp, cp, pp, dp, mb, schedules in _placements(model, cluster, global_batch, c):
        cp_runs = _cp_algorithms(model, tp, cp, c, framework)
        if not cp_runs:
            continue
        grads = grad_group_size({"dp": dp, "cp": cp})
        experts = _experts(model, tp, cp, dp, c, framework)
        for schedule, v in _run_by(framework, pp, schedules):
            for zero, shard in _zero_shards(grads, dp, tp, cp, pp, c, framework, cluster):
                for sp, overlap in _sp_values(tp, cp, c, framework, model):
                    for remat in c.remats(framework):
                        for (offload, layers), algorithm, dtype, (ep, etp) in itertools.product(
                            _offloads(c, framework, zero, pp, remat, model.layers, grads),
                            _algorithms(grads, zero, c, framework),
                            _beside(dtypes, overlap),
                            experts,
                        ):
                            yield Strategy(
                                dp=dp,
                                tp=tp,
                                pp=pp,
                                cp=cp,
                                cp_algorithm=cp_runs[0],
                                ep=ep,
                                etp=etp,
                                micro_batch=mb,
                                global_batch=global_batch,
                                schedule=schedule,
                                virtual_stages=v,
                                zero=zero,
                                dp_shard=shard,
                                sequence_parallel=sp,
                                tp_comm_overlap=overlap,
                                remat=remat,
                                dp_algorithm=algorithm,
                                dtype=dtype,
                                offload=offload,
                                offload_activation_layers=layers,
                                framework=framework,
                            )


def count_candidates(model: ModelSpec, cluster: Cluster, global_batch: int, c: Constraints = Constraints()) -> int:
    """How many strategies ``candidates`` yields, counted without building them (the same loops, the innermost
    ones multiplied out), so the planner can refuse a search too large before pricing any.

    >>> from plansim.hardware import load_hardware
    >>> from plansim.workload import load_model
    >>> m, cl = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=8)
    >>> count_candidates(m, cl, 64) == sum(1 for _ in candidates(m, cl, 64))
    True
    """
    return search_work(model, cluster, global_batch, c).candidates


@dataclass(frozen=True)
class SearchWork:
    """What pricing the space costs, counted before any candidate is priced (``search_work``).

    ``candidates``: the strategies (a few kB each while the search runs). ``block_walks``: the blocks the analytic
    engine walks, each candidate walking its busiest stage's blocks (``ceil(layers / pp)``), plus the interleaved
    schedule's pass orders, compressed once per (pp, micro-batches, chunks) at a cost of ``pp m v^2`` comparisons,
    ``INTERLEAVED_PER_BLOCK`` of them as dear as one block."""

    candidates: int
    block_walks: int


#: Pass-order comparisons of the interleaved schedule as dear as one block walked: fitted to the analytic pass of
#: plans of 24- to 500-block models on 8 GPUs (526 candidates timed one by one: a block 141 us, a comparison 1.0 us).
INTERLEAVED_PER_BLOCK = 140


def search_work(model: ModelSpec, cluster: Cluster, global_batch: int, c: Constraints = Constraints()) -> SearchWork:
    """The work of pricing ``candidates``, counted with its loops without building a strategy (``SearchWork``).

    >>> from plansim.hardware import load_hardware
    >>> from plansim.workload import load_model
    >>> m, cl = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=8)
    >>> w = search_work(m, cl, 64)
    >>> w.block_walks >= sum(-(-m.layers // s.pp) for s in candidates(m, cl, 64))
    True
    """
    c = c or Constraints()
    total = blocks = 0
    orders: set[tuple[int, int, int]] = set()
    for framework in c.frameworks:
        dtypes = _dtypes(model, cluster, c, framework)
        for tp, cp, pp, dp, mb, schedules in _placements(model, cluster, global_batch, c):
            if not _cp_algorithms(model, tp, cp, c, framework):
                continue
            grads = grad_group_size({"dp": dp, "cp": cp})
            zeros = _zero_shards(grads, dp, tp, cp, pp, c, framework, cluster)
            per_schedule = sum(
                len(_algorithms(grads, zero, c, framework))
                * sum(len(_offloads(c, framework, zero, pp, r, model.layers, grads)) for r in c.remats(framework))
                for zero, _ in zeros
            )
            sp = sum(len(_beside(dtypes, overlap)) for _, overlap in _sp_values(tp, cp, c, framework, model))
            runs = _run_by(framework, pp, schedules)
            count = len(runs) * per_schedule * sp * len(_experts(model, tp, cp, dp, c, framework))
            total += count
            blocks += count * -(-model.layers // pp)
            m = global_batch // (dp * mb)
            orders.update((pp, m, v) for name, v in runs if SCHEDULES[name].model_chunks and count)
    interleaved = sum(pp * m * v * v for pp, m, v in orders)
    return SearchWork(total, blocks + -(-interleaved // INTERLEAVED_PER_BLOCK))


#: The parallel axes the planner gives degrees, in its search order (the first changing slowest): each but the last
#: takes the values its ``_axis_values`` entry allows, data parallelism the GPUs the others leave.
SEARCH_AXES = ("tp", "cp", "pp", "dp")

#: The sequence length from which the planner searches context parallelism by default (issue 35: "by default for
#: sequences of 16K and longer"); below it cp = 1 unless ``Constraints.cp`` asks for more.
CP_FROM_SEQ_LEN = 16_384


def _axis_values(model: ModelSpec, cluster: Cluster, c: Constraints) -> dict[str, Callable[[int], list[int]]]:
    """The degrees the planner tries for each axis of ``SEARCH_AXES`` but the last, given the GPUs left to split."""
    return {
        "tp": lambda left: _tp_values(model, cluster, c),
        "cp": lambda left: _cp_values(model, left, c),
        "pp": lambda left: _pp_values(model, left, c),
    }


def _cp_values(model: ModelSpec, left: int, c: Constraints) -> list[int]:
    """The context-parallel degrees tried: ``c.cp``, or every divisor of the GPUs left for a sequence of
    ``CP_FROM_SEQ_LEN`` or more (the family's rule keeps those that split it), else none but 1."""
    if c.cp is not None:
        return [c.cp] if left % c.cp == 0 else []
    if model.seq_len < CP_FROM_SEQ_LEN:
        return [1]
    return divisors(left)


def _cp_algorithms(model: ModelSpec, tp: int, cp: int, c: Constraints, framework: str) -> list[str | None]:
    """The form of context parallelism a candidate runs under ``framework``: ``c.cp_algorithm`` or the framework's
    default (its ``context_parallel`` rule), where the framework runs it and the model's heads split over
    ``tp x cp`` for an all-to-all; ``[None]`` without context parallelism, empty where none runs."""
    if cp == 1:
        return [None]
    rule = load_framework(framework).rules.context_parallel.value
    wanted = c.cp_algorithm or rule.default
    if wanted is None or wanted not in rule.algorithms:
        return []
    if wanted == "all_to_all" and heads_swap_problems(model, span({"tp": tp, "cp": cp}, ("tp", "cp"))):
        return []
    return [wanted]


def _experts(
    model: ModelSpec, tp: int, cp: int, dp: int, c: Constraints, framework: str
) -> list[tuple[int, int | None]]:
    """(ep, etp) pairs searched for a placement under ``framework`` (``etp`` None: the framework's default,
    ``Strategy.expert_tp``): ``(1, None)`` for a model without experts; for a mixture-of-experts model ``c.ep`` or
    every divisor of its experts, each with ``c.etp`` or the default and 1, kept where the framework runs them (its
    ``expert_parallel`` rule: ep at all, beside cp, which etp) and etp x ep divides the tp x cp x dp ranks the expert
    layers regroup (``strategy.mesh.expert_fold``; hybrid sharding's narrower group is the checks' business)."""
    experts = getattr(model, "experts", 0) or 0
    if not experts:
        return [(1, None)] if c.ep in (None, 1) and c.etp in (None, tp) else []
    rule = load_framework(framework).rules.expert_parallel.value
    ranks = span({"tp": tp, "cp": cp, "dp": dp}, ("tp", "cp", "dp"))
    out: list[tuple[int, int | None]] = []
    for ep in divisors(experts) if c.ep is None else [c.ep]:
        if experts % ep or (ep > 1 and (not rule.ep or (cp > 1 and not rule.with_cp))):
            continue
        default = rule.default_etp(tp, ep)
        allowed = rule.etp_values(tp, ep)
        for etp in [c.etp] if c.etp is not None else list(dict.fromkeys((default, 1))):
            if (allowed is not None and etp not in allowed) or (ep == 1 and etp != tp and allowed is None):
                continue
            if ranks % span({"etp": etp, "ep": ep}, ("etp", "ep")):  # the ranks one expert layer splits over
                continue
            out.append((ep, None if etp == default else etp))
    return out


def _placements(
    model: ModelSpec, cluster: Cluster, global_batch: int, c: Constraints
) -> Iterator[tuple[int, int, int, int, int, list[tuple[str, int]]]]:
    """The outer loops of the space: (tp, cp, pp, dp, micro-batch, its schedules with virtual stages)."""
    values = _axis_values(model, cluster, c)

    def allowed(axis: str, left: int) -> list[int]:  # the axis's values the model's family splits over
        return [d for d in values[axis](left) if not axis_problems(model, axis, d)]

    for degrees in degree_splits(cluster.num_gpus, SEARCH_AXES, allowed):
        if axis_problems(model, SEARCH_AXES[-1], degrees[SEARCH_AXES[-1]]):  # the GPUs left, by the same rules
            continue
        tp, cp, pp, dp = degrees["tp"], degrees["cp"], degrees["pp"], degrees["dp"]
        if (c.dp is not None and dp != c.dp) or global_batch % dp:
            continue
        for mb in _micro_batches(global_batch // dp, c):
            m = global_batch // (dp * mb)
            yield tp, cp, pp, dp, mb, _schedules(model, pp, m, c)


def _tp_values(model: ModelSpec, cluster: Cluster, c: Constraints) -> list[int]:
    out = []
    for tp in divisors(cluster.num_gpus):
        if c.tp is not None and tp != c.tp:
            continue
        if tp > cluster.gpus_per_node and not c.allow_cross_node_tp:
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


def _run_by(framework: str, pp: int, schedules: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """The ``schedules`` the framework runs (its ``schedules`` rule); with one stage the schedule plays no part."""
    if pp == 1:
        return schedules
    runs = load_framework(framework).rules.schedules.value
    return [(name, v) for name, v in schedules if name in runs]


def _zero_values(grads: int, pp: int, c: Constraints, framework: str) -> list[int]:
    """The ZeRO stages searched where the gradients are reduced over ``grads`` ranks (dp x cp)."""
    if grads == 1:  # nothing to shard: every stage is ZeRO-0, but for what a framework offloads only under ZeRO
        offloaded = {z for form in load_framework(framework).rules.offload.value.forms for z in form.zero}
        runs = modelled_zero_stages(framework, pp)
        stages = [0, *sorted(z for z in offloaded if z in runs)] if c.offload else [0]
        return [z for z in stages if c.zero is None or z == c.zero]
    values = modelled_zero_stages(framework, pp)  # what the framework runs and plansim models (check_strategy)
    return [z for z in values if c.zero is None or z == c.zero]


def _zero_shards(
    grads: int, dp: int, tp: int, cp: int, pp: int, c: Constraints, framework: str, cluster: Cluster
) -> list[tuple[int, int | None]]:
    """(ZeRO stage, ``dp_shard``) pairs: each stage sharded over the whole dp group and, where the framework
    hybrid-shards that stage (its ``hybrid_shard`` rule), over each node's data-parallel ranks (``gpus_per_node //
    tp``, the group PyTorch's HSDP and torchtitan shard within), replicated across nodes, when that splits dp
    (without context parallelism: hybrid sharding with it is not searched)."""
    out: list[tuple[int, int | None]] = []
    node = cluster.gpus_per_node // tp if cluster.gpus_per_node % tp == 0 and cp == 1 else 0
    hybrid = load_framework(framework).rules.hybrid_shard.value
    for zero in _zero_values(grads, pp, c, framework):
        out.append((zero, None))
        if zero in hybrid and 1 < node < dp and dp % node == 0:
            out.append((zero, node))
    return out


def _sp_values(tp: int, cp: int, c: Constraints, framework: str, model: ModelSpec) -> list[tuple[bool, bool]]:
    """(sequence parallel, tp_comm_overlap) pairs: with tp > 1 sequence parallelism off and on; with it and
    ``c.tp_comm_overlap`` true, the tensor-parallel GEMMs pipelined with their collectives instead, where the
    framework does that (its ``tp_comm_overlap`` rule) for a transformer's blocks; with context parallelism, sequence
    parallelism only where the framework combines the two (its ``context_parallel`` rule)."""
    rules = load_framework(framework).rules
    pipelined = rules.tp_comm_overlap.value
    # a mixture-of-experts model with tp > 1 trains only with sequence parallelism where its MoE layer says so
    moe_needs_sp = tp > 1 and bool(getattr(model, "experts", 0)) and rules.expert_parallel.value.needs_sequence_parallel
    values = [] if moe_needs_sp else [(False, False)]
    if tp > 1 and (cp == 1 or rules.context_parallel.value.with_sequence_parallel):
        values += [(True, False)]
        if pipelined is not None and family_of(model).transformer:
            values += [(True, True)]
    return [
        (sp, overlap)
        for sp, overlap in values
        if (c.sequence_parallel is None or sp == c.sequence_parallel) and overlap == bool(c.tp_comm_overlap)
    ]


def _dtypes(model: ModelSpec, cluster: Cluster, c: Constraints, framework: str) -> tuple[str | None, ...]:
    """The training dtypes searched under ``framework``: ``c.dtypes``, fp8 only where the framework trains in FP8 on
    this GPU and model at its default recipe (``checks.fp8_problems``)."""
    return tuple(
        d
        for d in c.dtypes(cluster)
        if d != "fp8" or not fp8_problems(Strategy(dtype="fp8", framework=framework), model, cluster)
    )


def _beside(dtypes: tuple[str | None, ...], overlap: bool) -> tuple[str | None, ...]:
    """The dtypes searched beside ``tp_comm_overlap``: not fp8 with it (its FP8 chunked GEMMs are not modelled)."""
    return tuple(d for d in dtypes if not (overlap and d == "fp8"))


#: The shares of a model's blocks whose activations the planner tries offloading (``offload=activations``; Megatron-LM
#: offloads the first ``--cpu-offloading-num-layers`` blocks, fewer than all): a quarter to all but one.
OFFLOAD_LAYER_SHARES = (0.25, 0.5, 0.75)


def _offloads(
    c: Constraints, framework: str, zero: int, pp: int, remat: str, layers: int, grads: int
) -> list[tuple[tuple[str, ...], int | None]]:
    """(offload, offload_activation_layers) pairs searched: none (but where ZeRO > 0 shards nothing, over ``grads``
    = 1 rank: there only to offload), and each combination of the kinds ``c.offload`` allows that ``framework`` runs
    at ``zero`` (its ``offload`` rule), activations where it offloads them beside ``pp`` stages and ``remat``, over a
    few block counts (``OFFLOAD_LAYER_SHARES``, and all blocks but one)."""
    out: list[tuple[tuple[str, ...], int | None]] = [((), None)] if zero == 0 or grads > 1 else []
    if not c.offload:
        return out
    rule = load_framework(framework).rules.offload.value
    for form in rule.forms:
        kinds = tuple(k for k in OFFLOAD_KINDS if k in form.kinds)  # one order: the schema's
        if zero not in form.zero or not set(kinds) <= set(c.offload):
            continue
        if "activations" not in kinds:
            out.append((kinds, None))
            continue
        if (pp > 1 and not rule.activations_with_pipeline) or (remat != "none" and not rule.activations_with_remat):
            continue
        counts = sorted({max(1, int(share * layers)) for share in OFFLOAD_LAYER_SHARES} | {layers - 1} - {0})
        out += [(kinds, n) for n in counts if n < layers]
    return out


def _algorithms(dp: int, zero: int, c: Constraints, framework: str) -> list[str]:
    """The all-reduce algorithms searched where ``dp`` ranks reduce the gradients (dp x cp) at ``zero`` under
    ``framework`` (``Constraints.algorithms``): one where nothing is reduced, one per sharded class under ZeRO >= 1."""
    searched = c.algorithms(framework)
    if dp == 1:
        return [searched[0]]
    wanted = [a for a in searched if not ALLREDUCE_ALGORITHMS[a].power_of_two or dp & (dp - 1) == 0]
    if zero >= 1:  # sharded collectives run as the entry's sharded_with (ring, butterfly, nccl): one of each
        firsts: dict[str, str] = {}
        for a in wanted:
            firsts.setdefault(ALLREDUCE_ALGORITHMS[a].sharded_with, a)
        # a class whose sharded algorithm is an all-reduce left out of the search is left out too (tree's
        # reduce-scatters are rings, and ring, NCCL's ring forced, is not searched by default), unless none is left
        kept = [a for sharded, a in firsts.items() if sharded in wanted or sharded not in ALLREDUCE_ALGORITHMS]
        wanted = kept or list(firsts.values())
    return wanted
