"""The words a new user meets (issue 17): link names that exist and a command listing them, errors in CLI terms,
the defaults the README shows, the Megatron-style reference excluded by the user's own constraint, ``--objective cost``
without a price, integer ranks in results.csv, "known hardware"."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plansim.analytic.engine import simulate_analytic
from plansim.cli.app import app
from plansim.hardware import load_hardware
from plansim.planner import Constraints, plan
from plansim.planner.explain import is_megatron_style
from plansim.strategy.schema import Strategy
from plansim.workload import load_model

runner = CliRunner()

SIM = ["simulate", "-m", "gpt3-1.3b", "-H", "dgx-h100", "-g", "16", "-s", "dp=16,micro_batch=1,global_batch=16",
       "--engine", "des"]  # fmt: skip


def _one_error_line(res: object) -> str:
    assert res.exit_code == 2, res.output  # type: ignore[attr-defined]
    lines = [line for line in res.stderr.splitlines() if line.strip()]  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_simulate_help_names_real_links_and_the_listing() -> None:
    res = runner.invoke(app, ["simulate", "--help"], env={"COLUMNS": "200"})
    text = " ".join(res.stdout.replace("│", " ").split())
    assert "leaf0/rail0" in text and "plansim hardware --links" in text
    assert not re.search(r"\bleaf0[,)]", text)  # leaf0 alone is no vertex of a DGX


def test_hardware_links_lists_every_vertex_kind_of_the_topology() -> None:
    res = runner.invoke(app, ["hardware", "--links", "-H", "dgx-h100", "-g", "16"])
    assert res.exit_code == 0, res.output
    graph = load_hardware("dgx-h100", gpus=16).topology
    kinds = {data["kind"] for _, data in graph.nodes(data=True)}
    for kind in kinds:  # the first vertex of each kind (node 0's, the fabric's) is named in the listing
        first = min((v for v, d in graph.nodes(data=True) if d["kind"] == kind and d.get("node") in (0, None)), key=len)
        assert first in res.stdout, (kind, first)
    assert "leaf0/rail0..leaf0/rail7" in res.stdout and "gpu0..gpu15" in res.stdout
    ok = runner.invoke(app, [*SIM, "--fail-link", "leaf0/rail1", "--format", "json"])
    assert ok.exit_code == 0, ok.output


def test_link_errors_speak_cli() -> None:
    zero = _one_error_line(runner.invoke(app, [*SIM, "--degrade-link", "spine0=0"]))
    assert "--fail-link" in zero and "list them under" not in zero  # the factor's range names the option
    unknown = _one_error_line(runner.invoke(app, [*SIM, "--degrade-link", "leaf0=0.5"]))
    assert "plansim hardware --links -H dgx-h100 -g 16 lists them" in unknown and "Fabric" not in unknown


def test_simulate_and_validate_default_the_hardware_as_plan_does() -> None:
    res = runner.invoke(app, ["simulate", "-m", "gpt3-1.3b", "-s", "dp=8,micro_batch=1,global_batch=8", "-f", "json"])
    assert res.exit_code == 0, res.output
    alone = simulate_analytic(load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=8), Strategy.parse("dp=8"))
    assert json.loads(res.stdout)["hardware"] == "dgx-a100"
    assert json.loads(res.stdout)["peak_memory_bytes"] == alone.peak_memory_bytes
    from plansim.validation.run import DEFAULT_HARDWARE, resolve_hardware

    assert resolve_hardware("cpu", None) == DEFAULT_HARDWARE == "dgx-a100"
    assert resolve_hardware("cpu", "dgx-h100") == "dgx-h100"


def test_megatron_reference_excluded_by_the_users_constraint_says_so() -> None:
    """With --tp 4 on 8-GPU nodes the Megatron-style recipe (tp 8) cannot be among the candidates: the plan names the
    configuration that fits without the constraint, and the option that excludes it."""
    model, cluster = load_model("gpt3-13b"), load_hardware("dgx-h100", gpus=64)
    r = plan(model, cluster, global_batch=128, constraints=Constraints(tp=4), des=False, milp=False)
    assert r.megatron is None
    m = re.search(r"within your constraints: the one that fits, (.+), is excluded by --tp 4\.", r.explanation)
    assert m is not None, r.explanation
    assert "No Megatron-style configuration (tp within a node, pp to fit, mb 1, selective) fits" not in r.explanation
    words = m.group(1).split()
    fields = {w[:2]: int(w[2:]) for w in words if w[:2] in ("dp", "pp", "mb") and w[2:].isdigit()}
    s = Strategy(dp=fields["dp"], tp=8, pp=fields["pp"], micro_batch=fields["mb"], global_batch=128,
                 sequence_parallel=True, remat="selective", zero=1)  # fmt: skip
    assert is_megatron_style(s, 8) and simulate_analytic(model, cluster, s).fits
    free = plan(model, cluster, global_batch=128, des=False, milp=False)
    assert free.megatron is not None and free.megatron.priced.strategy.tp == 8  # no constraint: it is there


def test_objective_cost_needs_a_price() -> None:
    argv = ["plan", "-m", "gpt3-1.3b", "-g", "8", "-B", "16", "--no-des", "--objective", "cost"]
    line = _one_error_line(runner.invoke(app, argv))
    assert "--price-per-gpu-hour" in line
    priced = runner.invoke(app, [*argv, "--price-per-gpu-hour", "2", "--format", "json"])
    assert priced.exit_code == 0 and json.loads(priced.stdout)["objective"] == "cost"
    sweep = runner.invoke(app, ["sweep", "-m", "gpt3-125m", "-g", "8", "-B", "16", "--objective", "cost", "--out", "x"])
    assert "--objective cost" in _one_error_line(sweep)


def test_results_csv_ranks_are_integers(tmp_path: Path) -> None:
    argv = ["plan", "-m", "gpt3-1.3b", "-g", "16", "-B", "64", "--no-des", "--top", "3", "--out", str(tmp_path)]
    assert runner.invoke(app, argv).exit_code == 0
    with (tmp_path / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    finalists = [r["rank"] for r in rows if r["role"] == "finalist"]
    assert finalists == ["1", "2", "3"]
    assert all(r["rank"] == "" for r in rows if r["role"] != "finalist")


@pytest.mark.parametrize("command", ["simulate", "plan"])
def test_unknown_hardware_names_the_known_hardware_profiles(command: str) -> None:
    argv = [command, "-m", "gpt3-1.3b", "-H", "dgx-z9", *(["-s", "dp=8"] if command == "simulate" else ["-B", "8"])]
    line = _one_error_line(runner.invoke(app, argv))
    assert "known hardware profiles are dgx-1, dgx-a100" in line and "hardwares" not in line
