"""Robust plans (plansim.uncertainty, plansim.planner.robust, ``plan --robust``): the profiles' ranges, each input
moving what it names, the worst case against a brute force over every corner of the box, and each break-even value
re-priced (the winner and its rival tie there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import plansim
from plansim.analytic import AnalyticCache, simulate_analytic
from plansim.cli.app import app
from plansim.costs.interference import interference_model
from plansim.errors import PlansimError
from plansim.files.data import data_dir
from plansim.hardware import load_hardware
from plansim.hardware.loader import load_node
from plansim.planner import Constraints
from plansim.planner.space import candidates
from plansim.uncertainty import INPUTS, corners, nominal, perturbed, ranges, worst_corners
from plansim.workload import load_model

#: its module-scoped fixtures computed once: every test here on one pytest-xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_robust")

runner = CliRunner()

#: A small space: two nodes, so every input applies; two remat policies, one all-reduce, up to 4 stages, micro-batch
#: 1: 152 candidates under Megatron-LM's schedules.
SMALL = Constraints(remat=("none", "full"), dp_algorithms=("nccl",), max_pp=4, max_micro_batch=1)


def _two_nodes():  # type: ignore[no-untyped-def]
    return load_hardware("dgx-a100", gpus=16)


def test_every_shipped_profile_range_holds_its_value() -> None:
    for node in ("dgx-a100", "dgx-h100", "hgx-h200", "dgx-1", "pcie-4x4090"):
        c = load_hardware(node, gpus=2 * load_hardware(node).gpus_per_node)
        for name, (low, high) in ranges(c).items():
            assert low <= nominal(c)[name] <= high, (node, name)
    box = ranges(_two_nodes())
    assert box["inter_node_efficiency"] == (0.848, 0.96)  # nccl-tests issue #119's average, issue #812's 192/200
    assert box["gemm_efficiency"] == (0.70, 0.859)  # the DL performance guide's 70%, stas00's 267.9 of 312
    assert box["interference"] == (1.76, 2.5)  # nccl issue #1428: the GEMM's 2.08/1.18, element-wise 0.05/0.02


def test_a_range_without_the_profiles_value_is_refused_in_one_line(tmp_path: Path) -> None:
    text = Path(data_dir("hardware_profiles") / "nodes" / "dgx-a100.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("inter_node_efficiency: [0.848, 0.96]", "inter_node_efficiency: [0.5, 0.9]"))
    with pytest.raises(PlansimError) as err:
        load_node(bad)
    message = str(err.value)
    assert "\n" not in message and "uncertainty" in message and "0.96" in message


def test_each_input_moves_what_it_names() -> None:
    c = _two_nodes()
    assert perturbed(c, nominal(c)) == c
    slow_net = perturbed(c, {"inter_node_efficiency": 0.5})
    assert slow_net.group_link(2, 8).bandwidth_Bps == pytest.approx(c.group_link(2, 8).bandwidth_Bps * 0.5 / 0.96)
    gemm = perturbed(c, {"gemm_efficiency": 0.39})  # half the profile's 0.78: every point of the curve halves
    assert gemm.gpu.matmul_efficiency(1e9) == pytest.approx(c.gpu.matmul_efficiency(1e9) / 2)
    assert gemm.gpu.matmul_efficiency(1e13) == pytest.approx(0.39)
    assert perturbed(c, {"gpu_to_gpu_cv": 0.03}).gpu.gpu_to_gpu_cv == 0.03
    # interference: the measured kernel's slowdown at the measured load is the value set
    m = c.gpu.overlap
    assert m is not None
    for value in (1.76, 2.5):
        model = interference_model(perturbed(c, {"interference": value}).gpu)
        assert model.slowdown(m.channels, m.load_hbm_Bps) == pytest.approx(value)
    with pytest.raises(PlansimError, match="inter-node efficiency 120%"):
        perturbed(c, {"inter_node_efficiency": 1.2})


def test_a_gpu_without_its_own_measurement_varies_the_reference_one() -> None:
    """H100 has no overlap measurement: at its profile value the borrowed one prices exactly as the fallback."""
    c = load_hardware("dgx-h100", gpus=16)
    assert c.gpu.overlap is None
    same = perturbed(c, {"interference": INPUTS["interference"].value(c) + 1e-12})
    assert interference_model(same.gpu).sensitivity == pytest.approx(interference_model(c.gpu).sensitivity)


def _small_space():  # type: ignore[no-untyped-def]
    model, cluster = load_model("gpt3-125m"), _two_nodes()
    return model, cluster, list(candidates(model, cluster, 32, SMALL))


def test_the_worst_case_is_among_the_worst_corners_by_brute_force() -> None:
    """Every candidate's step time at every corner of the box (2^4 = 16): the largest is the one at
    ``worst_corners``, every input at its worse end (one corner: each input is monotone, inter-node efficiency too
    since an NCCL call loads HBM at its own pace), and no input's better end is ever the slower one."""
    model, cluster, space = _small_space()
    assert 20 <= len(space) <= 400
    box = list(corners(cluster))
    assert len(box) == 16
    caches = {tuple(v.items()): AnalyticCache(model, perturbed(cluster, v)) for v in box}
    pinned = [tuple(v.items()) for v in worst_corners(cluster)]
    assert len(pinned) == 1 and pinned[0] in caches
    worst_ends = dict(pinned[0])
    checked = 0
    for s in space:
        try:
            times = {
                k: simulate_analytic(model, cache.cluster, s, cache=cache).step_time_s for k, cache in caches.items()
            }
        except PlansimError:
            continue
        assert max(times.values()) == pytest.approx(times[pinned[0]], rel=1e-12), s
        for corner, t in times.items():  # moving any one input from its worse end to the other never slows the step
            for name, value in corner:
                if value != worst_ends[name]:
                    worse = tuple((n, worst_ends[name] if n == name else v) for n, v in corner)
                    assert t <= times[worse] * (1 + 1e-12), (s, name)
        checked += 1
    assert checked >= 20


def test_robust_ranks_by_the_brute_force_worst_case() -> None:
    model, cluster, space = _small_space()
    caches = [AnalyticCache(model, perturbed(cluster, v)) for v in corners(cluster)]
    worst_of = {}
    for k, s in enumerate(space):
        try:
            results = [simulate_analytic(model, cache.cluster, s, cache=cache) for cache in caches]
        except PlansimError:
            continue
        if results[0].fits:
            worst_of[s] = (max(r.step_time_s for r in results), k)
    best = min(worst_of, key=lambda s: worst_of[s])
    r = plansim.plan(
        model, cluster, global_batch=32, constraints=SMALL, des=False, milp=False, splits=False, robust=True
    )
    assert r.winner == best
    assert r.winner_result is not None
    assert r.winner_result.step_time_s == pytest.approx(worst_of[best][0], rel=1e-12)
    assert r.robust is not None and r.robust.winner_worst_s == pytest.approx(worst_of[best][0], rel=1e-12)


@pytest.fixture(scope="module")
def robust_plan() -> plansim.planner.PlanResult:
    return plansim.plan("gpt3-125m", "dgx-a100", gpus=16, global_batch=32, top_k=4, des=False, robust=True)


def test_break_even_values_tie_when_re_priced(robust_plan: plansim.planner.PlanResult) -> None:
    """At each reported break-even value the winner and the rival price within 0.5% (the search stops at
    ``TIE``); there is at least one, and each is stated in the explanation."""
    report = robust_plan.robust
    assert report is not None and report.rivals
    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=16)
    rivals = {r.role: r.strategy for r in report.rivals}
    winner = robust_plan.winner
    found = 0
    for s in report.sensitivities:
        for b in s.break_evens:
            for value in (b.below, b.above):
                if value is None:
                    continue
                c = perturbed(cluster, {s.name: value})
                w = simulate_analytic(model, c, winner).step_time_s
                o = simulate_analytic(model, c, rivals[b.rival]).step_time_s
                assert abs(w / o - 1) <= 0.005, (s.name, value, w, o)
                assert INPUTS[s.name].show(value) in robust_plan.explanation
                found += 1
    assert found >= 1


def test_the_tornado_spans_each_range(robust_plan: plansim.planner.PlanResult) -> None:
    report = robust_plan.robust
    assert report is not None
    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=16)
    for s in report.sensitivities:
        for end, at in ((s.low, s.at_low_s), (s.high, s.at_high_s)):
            expected = simulate_analytic(model, perturbed(cluster, {s.name: end}), robust_plan.winner).step_time_s
            assert at == pytest.approx(expected, rel=1e-12)
        u = INPUTS[s.name]
        if u.monotone:  # the worse end is never faster (inter-node efficiency is not monotone: uncertainty.py)
            slower = s.at_low_s if u.worse < 0 else s.at_high_s
            assert slower >= report.winner_nominal_s * (1 - 1e-12)


def test_one_node_robust_plan_re_simulates_at_the_worst_corner() -> None:
    """On one node inter-node efficiency does not apply: one corner, at which the finalists' DES still runs."""
    r = plansim.plan("gpt3-125m", "dgx-a100", gpus=8, global_batch=32, top_k=2, milp=False, robust=True)
    assert r.robust is not None and r.winner is not None and r.winner_result is not None
    assert r.winner_result.engine == "des"
    corner = perturbed(load_hardware("dgx-a100", gpus=8), r.robust.worst)
    worst = plansim.simulate("gpt3-125m", corner, r.winner, engine="des")
    assert r.winner_result.step_time_s == pytest.approx(worst.step_time_s, rel=1e-12)
    assert r.winner_result.step_time_s > r.robust.winner_nominal_s


def test_cli_robust_json_and_chart(tmp_path: Path) -> None:
    args = ["plan", "-m", "gpt3-125m", "-H", "dgx-a100", "-g", "16", "-B", "32", "--no-des", "--top", "3"]
    result = runner.invoke(app, [*args, "--robust", "--format", "json", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    robust = data["robust"]
    assert [i["name"] for i in robust["inputs"]] == list(INPUTS)
    assert robust["sentences"][0].startswith("Ranked by the worst case")
    assert data["explanation"].startswith("Worst cases over the profiles' uncertainty ranges throughout.")
    assert data["winner_result"]["step_time_s"] == pytest.approx(robust["winner_worst_step_time_s"], rel=1e-12)
    assert (tmp_path / "out" / "robust.svg").exists() and (tmp_path / "out" / "robust.png").exists()
    plain = runner.invoke(app, [*args, "--format", "json"])
    assert "robust" not in json.loads(plain.output)
