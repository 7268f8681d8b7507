"""``plansim remat``: the MILP's schedule against every baseline at a budget, the trade-off curve under --out, and
one clear line with exit code 2 for bad input. Small graphs (two gpt3-125m blocks at layer granularity) keep it fast."""

from __future__ import annotations

import csv
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plansim.cli.app import app
from plansim.remat import BASELINES

#: its module-scoped fixtures computed once: every test here on one pytest-xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_cli_remat")

runner = CliRunner()
M125 = ["remat", "--model", "gpt3-125m"]
SMALL = ["remat", "--model", "gpt3-125m", "--stage-layers", "2", "--granularity", "layer", "--time-limit", "5"]


def run(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture(scope="module")
def curve(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """One run with --out and --format json at a budget only full and greedy fit (the MILP beats both): under flash
    attention the two blocks keep 107 MB, 57 MB under full recompute."""
    out = tmp_path_factory.mktemp("remat") / "out"
    r = run(*SMALL, "--budget", "0.08GB", "--out", str(out), "--format", "json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), out


def test_json_summary_milp_beats_every_feasible_baseline(curve) -> None:
    data, _ = curve
    assert data["model"] == "gpt3-125m" and data["budget_bytes"] == 0.08e9
    assert set(data["baselines"]) == set(BASELINES)
    milp = data["milp"]
    assert data["feasible"] and milp["fits"] and milp["status"] == "optimal" and milp["proven_optimal"]
    assert milp["peak_bytes"] <= data["budget_bytes"]
    assert milp["variables"] > 0 and milp["constraints"] > 0 and milp["bound_s"] is not None
    fitting = [b for b in data["baselines"].values() if b["fits"]]
    assert fitting, "the budget should admit at least one baseline"
    for b in fitting:
        assert milp["cost_s"] <= b["cost_s"] * (1 + 1e-9), (b["method"], milp["cost_s"], b["cost_s"])
    assert milp["recomputed_ops"] and all({"node", "for"} <= set(op) for op in milp["recomputed_ops"])


def test_out_writes_csv_charts_and_schedule(curve) -> None:
    data, out = curve
    assert {Path(p).name for p in data["files"]} == {"tradeoff.csv", "tradeoff.png", "tradeoff.svg", "schedule.json"}
    with (out / "tradeoff.csv").open() as f:
        rows = list(csv.DictReader(f))
    methods = {r["method"] for r in rows}
    assert methods == {"milp", *BASELINES}
    budgets = {float(r["budget_bytes"]) for r in rows}
    assert 0.08e9 in budgets and len(budgets) >= 10  # the default grid and the given budget
    assert all("overhead" in r for r in rows)
    png = (out / "tradeoff.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    assert "<svg" in (out / "tradeoff.svg").read_text()
    sched = json.loads((out / "schedule.json").read_text())
    assert sched["method"] == "milp" and sched["feasible"]
    names = {n["name"] for n in sched["nodes"]}
    assert sched["ops"] and all(op["name"] in names and op["action"] in ("compute", "free") for op in sched["ops"])
    assert sum(op["recompute"] for op in sched["ops"]) == data["milp"]["recomputed_nodes"]


def test_text_output_shows_the_schedule_and_every_baseline() -> None:
    r = run(*SMALL, "--budget", "80MB")
    assert r.exit_code == 0, r.output
    for words in ("proven optimal", "peak vs budget", "recomputed", "variables / constraints", *BASELINES):
        assert words in r.stdout, words


def test_infeasible_budget_is_a_result_not_an_error() -> None:
    r = run(*SMALL, "--budget", "1MB", "--format", "json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["feasible"] is False and data["milp"]["status"] == "infeasible"
    assert data["smallest_baseline_peak"]["peak_bytes"] > 1e6
    text = run(*SMALL, "--budget", "1MB")
    assert text.exit_code == 0 and "infeasible" in text.stdout and "smallest baseline peak" in text.stdout


def test_graph_file(tmp_path: Path) -> None:
    nodes = [{"id": f"f{i}", "cost": 1.0, "memory": 4, "layer": i} for i in range(4)]
    nodes += [{"id": f"b{i}", "cost": 2.0, "memory": 4, "backward": True, "layer": i} for i in range(4)]
    edges = [{"source": f"f{i}", "target": f"f{i + 1}"} for i in range(3)]
    edges += [{"source": "f3", "target": "b3"}] + [{"source": f"b{i + 1}", "target": f"b{i}"} for i in range(3)]
    edges += [{"source": f"f{i}", "target": f"b{i}"} for i in range(3)]
    path = tmp_path / "chain.json"
    path.write_text(json.dumps({"nodes": nodes, "edges": edges}))
    r = run("remat", "--graph", str(path), "--budget", "16", "--format", "json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["graph"]["nodes"] == 8 and data["graph"]["file"] == str(path)
    assert data["milp"]["fits"] and data["milp"]["peak_bytes"] <= 16


BAD = [
    ("bad budget", [*SMALL, "--budget", "20 parsecs"], ["--budget", "20 parsecs"]),
    ("negative budget", [*SMALL, "--budget", "-5GB"], ["--budget"]),
    ("unknown model", ["remat", "--model", "no-such-model", "--budget", "1GB"], ["no-such-model"]),
    ("both graph sources", [*SMALL, "--graph", "g.json", "--budget", "1GB"], ["--stage-layers", "--graph"]),
    ("neither graph source", ["remat", "--budget", "1GB"], ["--model", "--graph"]),
    ("too many layers", [*M125, "--stage-layers", "13", "--budget", "1GB"], ["--stage-layers", "12 layers"]),
    ("bad granularity", [*M125, "--granularity", "row", "--budget", "1GB"], ["--granularity", "row"]),
    ("bad solver", [*SMALL, "--solver", "gurobi", "--budget", "1GB"], ["--solver", "gurobi"]),
    ("tp not dividing heads", [*M125, "--tp", "5", "--budget", "1GB"], ["tp"]),
    ("missing graph file", ["remat", "--graph", "nothere/g.json", "--budget", "1GB"], ["nothere/g.json"]),
]


@pytest.mark.parametrize("label,argv,words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_and_exit_2(label, argv, words) -> None:
    r = runner.invoke(app, argv)
    assert r.exit_code == 2, (label, r.output)
    err = r.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in r.output, err
    for w in words:
        assert w in err, (w, err)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"nodes": [{"id": "a", "cost": 1}], "edges": []}', "nodes[0].memory"),
        ('{"nodes": [{"id": "a", "cost": -1, "memory": 1}], "edges": []}', "nodes[0].cost"),
        ('{"nodes": [{"id": "a", "cost": 1, "memory": 1}], "edges": [{"source": "a", "target": "z"}]}', "edges[0]"),
        ('{"nodes": [{"id": "a", "cost": 1, "memory": 1, "colour": 1}]}', "colour"),
        ('{"nodes": [', "malformed JSON"),
    ],
)
def test_malformed_graph_file_names_file_and_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "g.json"
    path.write_text(text)
    r = run("remat", "--graph", str(path), "--budget", "1GB")
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert str(path) in err and field in err and "\n" not in err, err


def test_api_does_not_import_matplotlib() -> None:
    code = "import sys, plansim.remat.api, plansim.cli.app; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_curve_never_gets_worse_with_more_memory(curve) -> None:
    """Proven-optimal MILP points: a larger budget never costs more (a regression check for the HiGHS scaling
    problem ``plansim.remat.api._scaled_tradeoff`` works around)."""
    _, out = curve
    with (out / "tradeoff.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["method"] == "milp" and r["status"] == "optimal"]
    costs = [float(r["cost"]) for r in sorted(rows, key=lambda r: float(r["budget_bytes"]))]
    assert len(costs) >= 5
    assert all(b <= a * (1 + 1e-6) for a, b in itertools.pairwise(costs)), costs


def test_chart_marks_budgets_without_a_schedule(tmp_path: Path) -> None:
    """A MILP budget with no schedule is drawn as an x whose legend says why (proven or timed out)."""
    import pandas as pd

    from plansim.report.remat_chart import tradeoff_chart

    inf = float("inf")
    frame = pd.DataFrame(
        [
            ("milp", 1e9, False, inf, inf, "infeasible"),
            ("milp", 2e9, False, inf, inf, "no solution"),
            ("milp", 3e9, True, 2.9e9, 0.1, "optimal"),
            ("full", 3e9, True, 1.5e9, 0.3, None),
        ],
        columns=["method", "budget_bytes", "feasible", "peak_bytes", "overhead", "status"],
    )
    svg = tmp_path / "c.svg"
    tradeoff_chart(frame, svg, "t")
    text = svg.read_text()
    assert "no schedule fits (proven)" in text and "no schedule found in the time limit" in text
    tradeoff_chart(frame[frame["feasible"]], tmp_path / "d.svg", "t")
    assert "no schedule" not in (tmp_path / "d.svg").read_text()
