"""The Checkmate MILP's build (``remat.checkmate.build_milp``) hands HiGHS the same model as the per-row build it
replaced: every column (name, bounds, kind, objective coefficient) and every row (name, sense, bounds, nonzero
coefficients) in order, hashed. The digests were taken from the build that added each constraint with PuLP's
operators (commit 4d58497); a faster build must leave them unchanged, so the solver's answers are unchanged."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from plansim.api import load_hardware, load_model
from plansim.remat import solve_remat, stage_graph
from plansim.remat.checkmate import build_milp
from plansim.remat.graph import RematGraph, linear_chain
from plansim.step.prepare import comm_pricer, prepare_step
from plansim.strategy.schema import Strategy

pytestmark = pytest.mark.xdist_group("milp_build")


def exported(prob: object) -> str:
    """The model as HiGHS is given it (PuLP's highspy interface: columns in ``variables()`` order, rows in
    insertion order, zero coefficients left out), every number as a float (signed zeros included)."""
    cols = [(v.name, v.lowBound, v.upBound, v.cat, float(prob.objective.get(v, 0.0))) for v in prob.variables()]  # type: ignore[attr-defined]
    rows = [
        (
            name,
            c.sense,
            None if c.getLb() is None else float(c.getLb()),
            None if c.getUb() is None else float(c.getUb()),
            sorted((v.name, float(x)) for v, x in c.items() if x != 0),
        )
        for name, c in prob.constraints.items()  # type: ignore[attr-defined]
    ]
    return repr((cols, rows, float(prob.objective.constant), prob.sense))  # type: ignore[attr-defined]


def digest(prob: object) -> str:
    return hashlib.sha256(exported(prob).encode()).hexdigest()[:16]


@pytest.fixture(scope="module")
def graphs() -> dict[str, RematGraph]:
    model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=8)
    # the graphs' op costs as the digests were taken (the A100 profile's kernel_launch_s was 4 us then): the digests
    # pin the build, not the kernel model, which has moved since
    cluster = dataclasses.replace(cluster, gpu=cluster.gpu.model_copy(update={"kernel_launch_s": 4.0e-6}))
    prep = prepare_step(model, cluster, Strategy(dp=8, micro_batch=1, global_batch=8))
    comm = comm_pricer(cluster, prep.strategy)
    return {
        "chain": linear_chain(8),
        "op2": stage_graph(prep.graph, range(2), prep.kernels, comm),
        "layer4": stage_graph(prep.graph, range(4), prep.kernels, comm, granularity="layer"),
    }


#: (graph, budget as a fraction of the keep-everything peak or None, in_flight) -> digest of the per-row build
DIGESTS = {
    ("chain", None, 1): "0af94005cae00321",
    ("chain", 0.5, 1): "827d4fea2c01e384",
    ("chain", 0.5, 2.5): "5f754a17b896c9d7",
    ("chain", 0.7, 3): "5fbbcf829f44c1ee",
    ("chain", None, 3): "0af94005cae00321",
    ("op2", None, 1): "043618220558aaf4",
    ("op2", 0.5, 1): "12c637e01768a03b",
    ("op2", 0.5, 2.5): "b45ec527b18aa1b4",
    ("op2", 0.7, 3): "2ce185e239f74564",
    ("op2", None, 3): "043618220558aaf4",
    ("layer4", None, 1): "55fefbe64125a0fe",
    ("layer4", 0.5, 1): "46672cf48e95e0ea",
    ("layer4", 0.5, 2.5): "cf5c783747fb7777",
    ("layer4", 0.7, 3): "6b607043a0aa7c2f",
    ("layer4", None, 3): "55fefbe64125a0fe",
}


@pytest.mark.parametrize(("name", "fraction", "in_flight"), list(DIGESTS))
def test_the_built_model_is_the_per_row_builds(
    graphs: dict[str, RematGraph], name: str, fraction: float | None, in_flight: float
) -> None:
    g = graphs[name]
    budget = None if fraction is None else solve_remat(g, method="none").peak_bytes * fraction
    assert digest(build_milp(g, budget, in_flight).prob) == DIGESTS[name, fraction, in_flight]


def _highs_lp(prob: object, solver: object) -> tuple[object, ...]:
    from plansim.files.outputs import c_stdout_silenced

    with c_stdout_silenced():
        solver.createAndConfigureSolver(prob)  # type: ignore[attr-defined]
    solver.buildSolverModel(prob)  # type: ignore[attr-defined]
    lp = prob.solverModel.getLp()  # type: ignore[attr-defined]
    a = lp.a_matrix_
    return (
        lp.num_col_, lp.num_row_, list(lp.col_cost_), list(lp.col_lower_), list(lp.col_upper_), list(lp.row_lower_),
        list(lp.row_upper_), list(a.start_), list(a.index_), list(a.value_), str(a.format_),
        [int(x) for x in lp.integrality_], lp.offset_, str(lp.sense_),
    )  # fmt: skip


@pytest.mark.parametrize("mip", [True, False])
@pytest.mark.parametrize(("name", "fraction", "in_flight"), [("op2", 0.5, 2.5), ("layer4", 0.7, 3), ("chain", None, 1)])
def test_highs_is_handed_the_model_pulp_would_hand_it(
    graphs: dict[str, RematGraph], name: str, fraction: float | None, in_flight: float, mip: bool
) -> None:
    """The bulk transfer (``milp._StartedHiGHS.buildSolverModel``) leaves HiGHS holding the model PuLP's own
    ``HiGHS.buildSolverModel`` (a call per column and per row) gives it: every array of its ``HighsLp``."""
    import pulp

    from plansim.remat.milp import _StartedHiGHS

    g = graphs[name]
    budget = None if fraction is None else solve_remat(g, method="none").peak_bytes * fraction
    prob = build_milp(g, budget, in_flight).prob
    theirs = _highs_lp(prob, pulp.HiGHS(mip=mip, msg=False))
    ours = _highs_lp(prob, _StartedHiGHS(None, mip=mip, msg=False))
    assert repr(ours) == repr(theirs)
