"""What ``plansim remat`` and notebooks share: the remat graph of a model's blocks or of a graph file, a byte-size
parser, the budget grid of a trade-off curve, the summary of a solve, and the files ``--out`` writes.

Costs are seconds and memory bytes throughout; conversions to ms and GB happen only where text is printed.

>>> g = remat_graph("gpt3-125m", stage_layers=1, granularity="layer")
>>> len(g), g.forward_count, g.meta["stage_layers"]
(8, 4, 1)
>>> parse_bytes("20GB"), parse_bytes("1.5 GiB"), parse_bytes("512MB"), parse_bytes("4096")
(20000000000.0, 1610612736.0, 512000000.0, 4096.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import networkx as nx

from plansim import units
from plansim.arguments import callback, flag, name_or_path, type_name
from plansim.errors import PlansimError, quoted, shown, shown_path
from plansim.limits import number, whole
from plansim.remat.baselines import BASELINES, run_baseline, tightest_baseline
from plansim.remat.graph import RematGraph
from plansim.remat.result import RematResult
from plansim.remat.solve import tradeoff

if TYPE_CHECKING:
    import pandas as pd

    from plansim.hardware import Cluster
    from plansim.workload import ModelSpec

__all__ = [
    "DEFAULT_STAGE_LAYERS",
    "RematPlan",
    "default_budgets",
    "load_graph_file",
    "parse_bytes",
    "plan_remat",
    "recomputed_ops",
    "remat_graph",
    "schedule_document",
    "smallest_baseline_peak",
    "tradeoff_curve",
    "tradeoff_frame",
]

#: How many transformer blocks ``remat_graph`` takes by default, per granularity. Blocks are identical, so a few
#: show the schedule's pattern; these keep the MILP solvable in seconds (layer: 4 nodes per block, ~8k variables
#: for 8 blocks; op: ~12 nodes per block, ~5k variables for 2 blocks, ~80k for 8, which HiGHS does not prove
#: optimal within a minute). The model's layer count caps them.
DEFAULT_STAGE_LAYERS: dict[str, int] = {"layer": 8, "op": 2}


def parse_bytes(text: str | float, option: str = "size") -> float:
    """``units.parse_bytes`` with a ``PlansimError`` naming ``option``, and sizes that must be finite and >= 0.

    >>> parse_bytes("2gb", "--budget")
    2000000000.0
    """
    try:
        value = units.parse_bytes(text)
    except ValueError as err:
        raise PlansimError(f"{option} {err}") from None
    if not math.isfinite(value) or value < 0:
        raise PlansimError(f"{option} {quoted(text)}: a size must be a finite number of bytes >= 0")
    return value


# --- the graph ---------------------------------------------------------------------------------------------------


def remat_graph(
    model: ModelSpec | str | Path | None = None,
    hardware: Cluster | str | Path = "dgx-a100",
    *,
    stage_layers: int | None = None,
    graph_file: str | Path | None = None,
    micro_batch: int = 1,
    tp: int = 1,
    sequence_parallel: bool = False,
    dtype: str | None = None,
    granularity: str = "op",
) -> RematGraph:
    """The graph to schedule: the first ``stage_layers`` transformer blocks of ``model`` (forward and backward, one
    micro-batch of ``micro_batch`` sequences, one tensor-parallel rank of ``tp`` on ``hardware``), or the graph in
    ``graph_file`` (``load_graph_file``; then the model and its options are not used).

    ``stage_layers`` defaults to ``DEFAULT_STAGE_LAYERS[granularity]`` capped by the model's layers. ``dtype``
    defaults to bf16 where the GPU has it, else fp16 (as ``Strategy.resolve``). ``meta`` records where the graph
    came from (model, hardware, stage_layers, granularity, or the file).
    """
    if stage_layers is not None:
        stage_layers = whole(stage_layers, "stage_layers", "stage_layers (--stage-layers)")
    micro_batch = whole(micro_batch, "micro_batch", "micro_batch (--micro-batch)")
    tp = whole(tp, "tp", "tp (--tp)")
    flag(sequence_parallel, "sequence_parallel")
    if graph_file is not None:
        name_or_path(graph_file, "graph_file (--graph)", "a graph file path")
        if stage_layers is not None:
            raise PlansimError("stage_layers (--stage-layers) and graph_file (--graph): give one of them, not both")
        return load_graph_file(graph_file)
    if model is None:
        raise PlansimError("remat graph: give a model (--model) or a graph file (--graph)")
    from plansim.files.yamlfile import validated
    from plansim.hardware import Cluster, load_hardware
    from plansim.remat.stage import GRANULARITIES, stage_graph
    from plansim.step.prepare import comm_pricer, prepare_step
    from plansim.strategy.schema import Strategy
    from plansim.workload import ModelSpec, load_model

    if granularity not in GRANULARITIES:
        raise PlansimError(
            f"granularity {quoted(granularity)} (--granularity): choose one of {', '.join(GRANULARITIES)}"
        )
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    if stage_layers is None:
        stage_layers = min(spec.layers, DEFAULT_STAGE_LAYERS[granularity])
    if not 1 <= stage_layers <= spec.layers:
        raise PlansimError(
            f"stage_layers={stage_layers} (--stage-layers): {spec.name} has {spec.layers} layers: "
            f"choose 1..{spec.layers}"
        )
    strategy = validated(
        Strategy,
        {
            "dp": 1,
            "tp": tp,
            "pp": 1,
            "micro_batch": micro_batch,
            "sequence_parallel": sequence_parallel,
            "dtype": dtype,
        },
        "remat strategy",
    )
    # one tensor-parallel group: the GPU and its tp - 1 peers
    cluster = replace(hardware, num_gpus=tp) if isinstance(hardware, Cluster) else load_hardware(hardware, gpus=tp)
    prep = prepare_step(spec, cluster, strategy)
    name = f"{spec.name}[0:{stage_layers}]" + (f"/tp{tp}" if tp > 1 else "") + f"/{granularity}"
    g = stage_graph(
        prep.graph,
        range(stage_layers),
        prep.kernels,
        comm_pricer(cluster, prep.strategy),
        granularity=cast(Literal["op", "layer"], granularity),
        name=name,
    )
    meta = {
        "source": "model",
        "model": spec.name,
        "hardware": cluster.node.name,
        "gpu": cluster.gpu.name,
        "stage_layers": stage_layers,
        "model_layers": spec.layers,
        "granularity": granularity,
        "micro_batch": micro_batch,
        "tp": tp,
        "sequence_parallel": sequence_parallel,
        "dtype": prep.strategy.compute_dtype,
    }
    return RematGraph(g.nodes, name=g.name, meta=meta)


_NODE_KEYS = {"id", "cost", "memory", "backward", "layer", "selective"}
#: Largest graph file read: 16 MiB of JSON (some 100,000 nodes); a YAML graph file has the data files' 1 MiB.
MAX_GRAPH_JSON_BYTES = 16 << 20


def load_graph_file(path: str | Path) -> RematGraph:
    """A graph from a node-link JSON or YAML file (``.json``; anything else is read as YAML, a superset)::

        {"nodes": [{"id": "a", "cost": 0.001, "memory": 1048576}, {"id": "b", "cost": 0.002, "memory": "2MiB",
                    "backward": false, "layer": 0, "selective": false}],
         "edges": [{"source": "a", "target": "b"}]}

    ``cost`` is seconds, ``memory`` bytes (a number or a size such as ``2MiB``); ``backward``, ``layer`` and
    ``selective`` are optional (``RematNode``). ``links`` is accepted for ``edges`` (networkx's
    ``node_link_data``). Every problem is a ``PlansimError`` naming the file and the field.
    """
    from plansim.files.yamlfile import parse_json, parse_yaml, read_text

    path = Path(path)
    src = shown_path(path)
    if path.suffix.lower() == ".json":
        data = parse_json(read_text(path, "graph", "check the path (--graph)", limit=MAX_GRAPH_JSON_BYTES), src)
    else:
        data = parse_yaml(read_text(path, "graph", "check the path (--graph)"), src)
    if not isinstance(data, dict):
        raise PlansimError(f"{src}: expected a mapping with 'nodes' and 'edges' at the top level")
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise PlansimError(f"{src}: field 'nodes': expected a non-empty list of nodes")
    edge_key = "edges" if "edges" in data or "links" not in data else "links"
    edges = data.get(edge_key, [])
    if not isinstance(edges, list):
        raise PlansimError(f"{src}: field '{edge_key}': expected a list of {{source, target}} mappings")
    dag = nx.DiGraph()
    for k, node in enumerate(nodes):
        where = f"{src}: field 'nodes[{k}]"
        if not isinstance(node, dict):
            raise PlansimError(f"{where}': expected a mapping with id, cost and memory")
        unknown = sorted(set(node) - _NODE_KEYS, key=str)
        if unknown:
            raise PlansimError(
                f"{where}.{shown(str(unknown[0]))}': unknown key (known: {', '.join(sorted(_NODE_KEYS))})"
            )
        for key in ("id", "cost", "memory"):
            if key not in node:
                raise PlansimError(f"{where}.{key}': required key is missing (add it)")
        nid = node["id"]
        if not isinstance(nid, str | int) or isinstance(nid, bool):
            raise PlansimError(f"{where}.id': expected a string or an integer, got {quoted(nid)}")
        if nid in dag:
            raise PlansimError(f"{where}.id': duplicate id {quoted(nid)}")
        attrs = {
            "cost": _number(node["cost"], f"{where}.cost'"),
            "memory": parse_bytes(node["memory"], f"{where}.memory'")
            if isinstance(node["memory"], str)
            else _number(node["memory"], f"{where}.memory'"),
        }
        for key in ("backward", "selective"):
            if key in node:
                if not isinstance(node[key], bool):
                    raise PlansimError(f"{where}.{key}': expected true or false, got {quoted(node[key])}")
                attrs[key] = node[key]
        if "layer" in node:
            if not isinstance(node["layer"], int) or isinstance(node["layer"], bool) or node["layer"] < 0:
                raise PlansimError(f"{where}.layer': expected an integer >= 0, got {quoted(node['layer'])}")
            attrs["layer"] = node["layer"]
        dag.add_node(nid, **attrs)
    for k, edge in enumerate(edges):
        where = f"{src}: field '{edge_key}[{k}]"
        if not isinstance(edge, dict) or "source" not in edge or "target" not in edge:
            raise PlansimError(f"{where}': expected a mapping with source and target")
        for key in ("source", "target"):
            if edge[key] not in dag:
                raise PlansimError(f"{where}.{key}': no node has id {quoted(edge[key])}")
        if edge["source"] == edge["target"]:
            raise PlansimError(f"{where}': a node cannot depend on itself ({quoted(edge['source'])})")
        dag.add_edge(edge["source"], edge["target"])
    if not nx.is_directed_acyclic_graph(dag):
        loop = nx.find_cycle(dag)
        cycle = " -> ".join(str(u) for u in [*(u for u, _ in loop), loop[0][0]])
        raise PlansimError(
            f"{src}: field '{edge_key}': the graph has a cycle ({shown(cycle, 160)}): a remat graph is a DAG"
        )
    try:
        graph = RematGraph.from_networkx(dag, name=path.stem)
    except PlansimError as err:
        raise PlansimError(f"{src}: {err}") from None
    return RematGraph(graph.nodes, name=graph.name, meta={"source": "file", "file": src})


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise PlansimError(f"{where}: expected a finite number >= 0, got {quoted(value)}")
    return float(value)


# --- solving -------------------------------------------------------------------------------------------------------


def smallest_baseline_peak(graph: RematGraph, in_flight: float = 1) -> tuple[str, float]:
    """The baseline with the smallest peak and that peak (greedy searched for its smallest)."""
    best = tightest_baseline(graph, 0.0, in_flight)
    return best.method, best.peak_bytes


def default_budgets(graph: RematGraph, n: int = 12, *, below: float = 0.8, in_flight: float = 1) -> list[float]:
    """``n`` evenly spaced budgets (bytes, ascending) from ``below`` times the tightest baseline's peak (but not under
    the peak no schedule can avoid: a node with its operands) up to the peak of ``none`` (keep everything), where
    the MILP's overhead reaches 0.

    >>> from plansim.remat.graph import linear_chain
    >>> default_budgets(linear_chain(16), 4)
    [7.2, 10.8, 14.4, 18.0]
    """
    if n < 1:
        raise PlansimError(f"default_budgets: n={n}, need at least one budget")
    top = run_baseline(graph, "none", None, in_flight).peak_bytes
    tightest = smallest_baseline_peak(graph, in_flight)[1]
    low = min(max(graph.memory_floor, below * tightest), top)
    if n == 1 or top <= low:
        return [top]
    step = (top - low) / (n - 1)
    return [low + k * step for k in range(n - 1)] + [top]


@dataclass(frozen=True)
class RematPlan:
    """The MILP and every baseline at one budget."""

    graph: RematGraph
    budget_bytes: float
    milp: RematResult
    baselines: dict[str, RematResult]

    @property
    def results(self) -> list[RematResult]:
        """The MILP, then the baselines."""
        return [self.milp, *self.baselines.values()]

    def summary(self, limit: int = 10, *, timings: bool = False) -> dict[str, Any]:
        """A JSON-ready account: the graph, the budget, the MILP (solver figures and the first ``limit`` recomputed
        ops) and each baseline (fits, peak, overhead). Infinities (no schedule) are None. With ``timings``, also the
        seconds each method took (``solve_time_s``; the MILP's ``build_time_s``): they differ run to run, so they
        are left out by default and the same input gives the same JSON."""
        total = self.graph.total_cost
        milp = _result_dict(self.milp, total, timings)
        rep = self.milp.solver
        if rep is not None:
            milp.update(
                solver=rep.solver,
                status=rep.status,
                proven_optimal=rep.status == "optimal",
                objective_s=rep.objective,
                bound_s=rep.bound,
                gap=rep.gap,
                gap_limit=rep.gap_limit,
                time_limit_s=rep.time_limit_s,
                variables=rep.variables,
                constraints=rep.constraints,
                start=rep.start,
            )
            if timings:
                milp.update(solve_time_s=rep.solve_time_s, build_time_s=rep.build_time_s)
        ops = recomputed_ops(self.graph, self.milp)
        milp["recomputed_distinct_nodes"] = len({op["index"] for op in ops}) if self.milp.schedule else None
        milp["recomputed_ops"] = ops[:limit]
        method, peak = smallest_baseline_peak(self.graph, self.milp.in_flight)
        g = self.graph
        return _finite(
            {
                "model": g.meta.get("model"),
                "hardware": g.meta.get("hardware"),
                "graph": {
                    "name": g.name,
                    "nodes": len(g),
                    "forward_nodes": g.forward_count,
                    "edges": g.edges,
                    "compute_s": total,
                    **{k: v for k, v in g.meta.items() if k not in ("model", "hardware")},
                },
                "budget_bytes": self.budget_bytes,
                "feasible": self.milp.feasible,
                "smallest_baseline_peak": {"method": method, "peak_bytes": peak},
                "milp": milp,
                "baselines": {m: _result_dict(r, total, timings) for m, r in self.baselines.items()},
            }
        )


def _result_dict(r: RematResult, total: float, timings: bool) -> dict[str, Any]:
    out = {
        "method": r.method,
        "fits": r.feasible,
        "peak_bytes": r.peak_bytes,
        "cost_s": r.cost,
        "recompute_s": r.recompute_cost,
        "overhead": _overhead(r.recompute_cost, total),
        "recomputed_nodes": r.replay.recomputed_nodes if r.replay else None,
        "reason": r.reason,
    }
    if timings:
        out["solve_time_s"] = r.solve_time_s
    return out


def _overhead(recompute: float, total: float) -> float:
    return recompute / total if math.isfinite(recompute) and total > 0 else math.nan


def _finite(x: Any) -> Any:
    """``x`` with every inf or nan float replaced by None (strict JSON has neither)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def plan_remat(
    graph: RematGraph,
    budget_bytes: float,
    *,
    solver: str = "highs",
    time_limit_s: float | None = None,
    gap: float | None = None,
    in_flight: float = 1,
) -> RematPlan:
    """Solve the MILP at ``budget_bytes`` and run every baseline at it. ``time_limit_s`` is wall-clock for the MILP
    (``solve_remat``: start search, build, solve); the baselines, for comparison, run outside it.

    Raises ``PlansimError`` (the CLI's one-line message) for a bad argument, before any solve."""
    number(budget_bytes, "remat_budget", "--budget")
    options = {"solver": solver, "time_limit_s": time_limit_s, "gap": gap}
    milp, *rest = tradeoff(graph, [budget_bytes], ("milp", *BASELINES), in_flight=in_flight, **options)
    return RematPlan(graph, budget_bytes, milp, {r.method: r for r in rest})


def recomputed_ops(graph: RematGraph, result: RematResult) -> list[dict[str, Any]]:
    """The schedule's recomputations in execution order: the node, and the stage (frontier node) they serve."""
    if result.schedule is None:
        return []
    seen: set[int] = set()
    out = []
    for op in result.schedule.ops:
        if op.action != "compute":
            continue
        if op.node in seen:
            out.append({"node": graph.nodes[op.node].name, "index": op.node, "for": graph.nodes[op.stage].name})
        seen.add(op.node)
    return out


def tradeoff_curve(
    graph: RematGraph,
    budgets: Iterable[float],
    *,
    methods: Sequence[str] | None = None,
    progress: Callable[[float], None] | None = None,
    in_flight: float = 1,
    **milp_options: Any,
) -> list[RematResult]:
    """``tradeoff`` one budget at a time, calling ``progress(budget)`` after each (for a progress bar). A
    ``time_limit_s`` holds for each budget's MILP (wall-clock, ``solve_remat``), so the curve takes at most about
    that times the number of budgets, and a point's answer does not depend on how many others there are."""
    from plansim.remat.solve import METHODS

    if isinstance(budgets, str) or not isinstance(budgets, Iterable):
        raise PlansimError(f"budgets: expected a list of byte counts, got {type_name(budgets)}")
    callback(progress, "progress")
    out: list[RematResult] = []
    for budget in budgets:
        out.extend(tradeoff(graph, [budget], methods or METHODS, in_flight=in_flight, **milp_options))
        if progress is not None:
            progress(budget)
    return out


def tradeoff_frame(results: Iterable[RematResult], graph: RematGraph | None = None) -> pd.DataFrame:
    """One row per result (``RematResult.to_row``) plus ``overhead``: recompute cost over the graph's total cost
    (NaN without a schedule). Without ``graph``, the total is read off any result with a schedule."""
    import pandas as pd

    rows = list(results)
    if graph is not None:
        total = graph.total_cost
    else:
        total = next((r.cost - r.recompute_cost for r in rows if r.replay is not None), math.nan)
    frame = pd.DataFrame([r.to_row() for r in rows])
    if frame.empty:
        return frame.assign(overhead=pd.Series(dtype=float))
    frame["overhead"] = [_overhead(r.recompute_cost, total) for r in rows]
    return frame


def schedule_document(graph: RematGraph, result: RematResult) -> dict[str, Any]:
    """A schedule as JSON-ready data: the result's figures, the nodes, and the ops with node names."""
    seen: set[int] = set()
    ops = []
    for op in result.schedule.ops if result.schedule else ():
        recompute = op.action == "compute" and op.node in seen
        if op.action == "compute":
            seen.add(op.node)
        ops.append(
            {
                "action": op.action,
                "node": op.node,
                "name": graph.nodes[op.node].name,
                "stage": op.stage,
                "recompute": recompute,
            }
        )
    rep = result.solver
    return _finite(
        {
            "graph": graph.name,
            "method": result.method,
            "budget_bytes": result.budget_bytes,
            "feasible": result.feasible,
            "status": rep.status if rep else None,
            "cost_s": result.cost,
            "recompute_s": result.recompute_cost,
            "peak_bytes": result.peak_bytes,
            "reason": result.reason,
            "nodes": [
                {
                    "index": i,
                    "name": n.name,
                    "cost_s": n.cost,
                    "memory_bytes": n.memory,
                    "deps": list(n.deps),
                    "backward": n.backward,
                    "layer": n.layer,
                }
                for i, n in enumerate(graph.nodes)
            ],
            "ops": ops,
        }
    )
