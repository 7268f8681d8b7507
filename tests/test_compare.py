"""``plansim compare``: every run equals the engine called on its own, scaling keeps what it says it keeps, link
tiers agree with the topology graph's own vertex kinds, and the CLI writes its files and fails in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from plansim.analytic.engine import simulate_analytic
from plansim.api import as_strategy, load_hardware, load_model
from plansim.cli.app import app
from plansim.comparison.compare import compare, scaled_strategy
from plansim.des.engine import simulate_des
from plansim.errors import PlansimError
from plansim.hardware import link_tier, list_hardware, load_node
from plansim.strategy.schema import Strategy

runner = CliRunner()

A = "dp=4,tp=2,pp=2,micro_batch=2,global_batch=32,schedule=1f1b,zero=1,remat=selective"
B = "dp=8,tp=2,pp=1,micro_batch=4,global_batch=32,remat=full"


def test_each_run_is_its_engine_alone() -> None:
    c = compare("gpt3-1.3b", [A, B], ["dgx-a100", "dgx-h100"], engine="des")
    model = load_model("gpt3-1.3b")
    assert [r.label.split(" @ ")[1] for r in c.runs] == ["dgx-a100"] * 2 + ["dgx-h100"] * 2
    frame = c.frame()
    for run, row in zip(c.runs, frame.to_dict("records"), strict=True):
        cluster = load_hardware(run.hardware, gpus=16)
        alone = simulate_des(model, cluster, Strategy.parse(A if "pp2" in run.label else B))
        assert run.result.step_time_s == alone.step_time_s
        assert run.result.peak_memory_bytes == alone.peak_memory_bytes
        assert row["step_time_s"] == alone.step_time_s
        assert row["memory_capacity_bytes"] == cluster.gpu.memory_bytes
        assert sum(row[f"time_{k}_s"] for k in alone.time_breakdown_s) == pytest.approx(alone.step_time_s)
        assert {k: row[f"mem_{k}_bytes"] for k in alone.memory_breakdown_bytes} == alone.memory_breakdown_bytes
    best = c.fastest()
    assert best is not None
    assert best.result.step_time_s == min(r.result.step_time_s for r in c.runs if r.result.fits)


def test_tier_bytes_are_the_busiest_link_of_each_tier() -> None:
    c = compare("gpt3-1.3b", [A], ["dgx-a100"], engine="des")
    run = c.runs[0]
    node = load_node("dgx-a100")
    links = run.result.timeline.link_bytes
    tiers = run.tier_bytes()
    assert set(tiers) == {link_tier(node, k) for k in links}
    for tier, value in tiers.items():
        assert value == max(v for k, v in links.items() if link_tier(node, k) == tier)
    assert compare("gpt3-1.3b", [A], engine="analytic").runs[0].tier_bytes() == {}


@pytest.mark.parametrize("name", [h["name"] for h in list_hardware()])
def test_link_tier_agrees_with_the_topology_graph(name: str) -> None:
    """Every edge of a 64-GPU cluster, both directions: the tier named from the link's text equals the one read
    off the graph's vertex attributes (kind, and tier for switches)."""
    cluster = load_hardware(name, gpus=64)
    graph = cluster.topology
    order = [t.name for t in cluster.node.fabric]

    def level(v: str) -> tuple[int, str]:
        data = graph.nodes[v]
        if data["kind"] == "switch":
            return 2 + order.index(data["tier"]), data["tier"]
        if data["kind"] == "nic":
            return 1, "nic"
        if data["kind"] == "pcie" or (data["kind"] == "gpu" and cluster.node.intra_node.topology == "pcie"):
            return 0, "pcie"
        return 0, "nvlink"

    for u, v in graph.edges:
        for a, b in ((u, v), (v, u)):
            assert link_tier(cluster.node, f"{a}->{b}") == max(level(a), level(b))[1]


def test_link_tier_rejects_a_foreign_name() -> None:
    with pytest.raises(ValueError, match="not a vertex"):
        link_tier(load_node("dgx-a100"), "gpu0->router7")


@settings(max_examples=60, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([1, 2, 4]),
    dp=st.integers(1, 8),
    mb=st.integers(1, 4),
    m=st.integers(1, 6),
    factor=st.integers(1, 16),
)
def test_scaled_strategy_keeps_what_it_says(tp: int, pp: int, dp: int, mb: int, m: int, factor: int) -> None:
    s = Strategy(dp=dp, tp=tp, pp=pp, micro_batch=mb, global_batch=dp * mb * m)
    gpus = tp * pp * factor
    weak = scaled_strategy(s, gpus, "per-replica")
    assert (weak.dp, weak.tp, weak.pp, weak.micro_batch) == (factor, tp, pp, mb)
    assert weak.num_microbatches == s.num_microbatches == m
    assert weak.global_batch == factor * mb * m
    if (dp * mb * m) % (mb * factor) == 0:
        strong = scaled_strategy(s, gpus, "fixed")
        assert (strong.dp, strong.global_batch) == (factor, s.global_batch)
        assert strong.num_microbatches * mb * factor == s.global_batch
    else:
        with pytest.raises(PlansimError, match="not a multiple of micro_batch x dp"):
            scaled_strategy(s, gpus, "fixed")
    if tp * pp > 1:
        for batch in ("fixed", "per-replica"):
            with pytest.raises(PlansimError, match="not a multiple of tp x cp x pp"):
                scaled_strategy(s, tp * pp * factor + 1, batch)


def test_scaling_points_are_their_engine_alone() -> None:
    c = compare("gpt3-1.3b", [A], engine="analytic", scaling_gpus=[8, 10, 12, 32], scaling_batch="per-replica")
    frame = c.scaling_frame()
    assert list(frame["gpus"]) == [8, 10, 12, 32]
    assert "not a multiple of tp x cp x pp = 4" in frame["reason"][1] and math.isnan(frame["tokens_per_s"][1])
    assert "whole number of nodes" in frame["reason"][2] and math.isnan(frame["tokens_per_s"][2])
    model = load_model("gpt3-1.3b")
    for g in (8, 32):
        s = scaled_strategy(c.runs[0].strategy, g, "per-replica")
        alone = simulate_analytic(model, load_hardware("dgx-a100", gpus=g), s)
        row = frame[frame["gpus"] == g].iloc[0]
        assert row["tokens_per_s"] == alone.tokens_per_s and row["global_batch"] == alone.strategy["global_batch"]


def test_labels_name_files_and_stay_unique(tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text("dp: 8\nmicro_batch: 2\nglobal_batch: 32\n")
    c = compare("gpt3-1.3b", [str(f), str(f), B], engine="analytic")
    assert [r.label for r in c.runs] == ["mine", "mine #2", "dp8 tp2 pp1 mb4 zero0 remat=full nccl"]


@pytest.mark.parametrize(
    "kwargs,words",
    [
        ({"strategies": []}, "at least one strategy"),
        ({"strategies": [A], "hardware": []}, "at least one hardware"),
        ({"strategies": [A], "engine": "exact"}, "--engine exact"),
        ({"strategies": [A], "scaling_gpus": [0]}, "--scaling 0"),
        ({"strategies": [A], "gpus": 0}, "--gpus 0"),
        ({"strategies": [A], "scaling_batch": "both"}, "--scaling-batch both"),
    ],
)
def test_bad_arguments_name_the_option(kwargs: dict, words: str) -> None:
    with pytest.raises(PlansimError, match=words.replace("-", r"\-")):
        compare("gpt3-1.3b", **kwargs)


def test_cli_compare_writes_tables_and_charts(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    res = runner.invoke(
        app,
        ["compare", "--model", "gpt3-1.3b", "-s", A, "-s", B, "--hardware", "dgx-a100", "--hardware", "dgx-h100",
         "--scaling", "16,32,64", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "Best by tokens/s:" in res.stdout and "scaling" in res.stdout
    for name in ("time_breakdown", "memory", "communication", "timeline", "scaling"):
        for ext in ("svg", "png"):
            assert (out / f"{name}.{ext}").stat().st_size > 1000, name
    rows = (out / "results.csv").read_text().splitlines()
    assert len(rows) == 1 + 4
    summary = json.loads((out / "results.json").read_text())
    assert len(summary["runs"]) == 4 and summary["fastest"] in [r["label"] for r in summary["runs"]]
    assert summary["objective"] == "tokens_per_s" and summary["best"] in [r["label"] for r in summary["runs"]]
    assert all(r["tier_bytes"]["nvlink"] > 0 for r in summary["runs"])
    scaling = (out / "scaling.csv").read_text().splitlines()
    assert len(scaling) == 1 + 12  # 4 runs x 3 counts; the fixed batch 32 at micro-batch 4 splits over dp <= 8 only:
    assert sum("not a multiple of micro_batch x dp" in line for line in scaling) == 4  # B at 32 and 64 GPUs, twice
    js = runner.invoke(app, ["compare", "--model", "gpt3-1.3b", "-s", B, "--engine", "analytic", "--format", "json"])
    assert js.exit_code == 0 and json.loads(js.stdout)["engine"] == "analytic"


@pytest.mark.parametrize(
    "argv,words",
    [
        (["-s", "dp=1,tp=3,micro_batch=1,global_batch=8"], ["tp"]),
        (["-s", B, "--hardware", "dgx-z900"], ["dgx-z900"]),
        (["-s", B, "--scaling", "16,lots"], ["--scaling"]),
        (["-s", B, "--engine", "exact"], ["--engine exact"]),
    ],
    ids=["impossible strategy", "unknown hardware", "bad scaling", "bad engine"],
)
def test_cli_compare_bad_input_is_one_line(argv: list[str], words: list[str]) -> None:
    res = runner.invoke(app, ["compare", "--model", "gpt3-1.3b", *argv])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for w in words:
        assert w in lines[0]


def test_hardware_from_a_file_runs_and_scales(tmp_path: Path) -> None:
    """A node type loaded from a YAML path (not a shipped name) serves the DES's link tiers and the scaling points."""
    text = (Path(__file__).parents[1] / "hardware_profiles" / "nodes" / "dgx-a100.yaml").read_text()
    node = tmp_path / "my-node.yaml"
    node.write_text(text.replace("name: dgx-a100", "name: my-node"))
    c = compare("gpt3-1.3b", [A], [str(node)], engine="des", scaling_gpus=[32])
    assert c.runs[0].hardware == "my-node" and c.runs[0].tier_bytes()["nvlink"] > 0
    assert c.scaling[0].result is not None, c.scaling[0].reason
    shipped = compare("gpt3-1.3b", [A], ["dgx-a100"], engine="des", scaling_gpus=[32])
    assert c.runs[0].result.step_time_s == shipped.runs[0].result.step_time_s
    assert c.scaling[0].result.step_time_s == shipped.scaling[0].result.step_time_s


def test_link_tier_reads_tier_names_that_end_in_digits() -> None:
    node = load_node("dgx-a100")
    renamed = node.model_copy(
        update={"fabric": [t.model_copy(update={"name": f"tier{k + 1}"}) for k, t in enumerate(node.fabric)]}
    )
    assert link_tier(renamed, "node0/nic0->tier10/rail0") == "tier1"
    assert link_tier(renamed, "tier10/rail0->tier20") == "tier2"


def _strict_json(text: str) -> object:
    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_json_and_files_when_scaling_points_cannot_run(tmp_path: Path) -> None:
    """Points that cannot run are null in JSON (never NaN), and with none that ran no scaling chart is drawn."""
    argv = ["compare", "--model", "gpt3-125m", "-s", "dp=8,micro_batch=1,global_batch=8", "--engine", "analytic"]
    res = runner.invoke(app, [*argv, "--scaling", "4,7", "--format", "json"])
    assert res.exit_code == 0, res.output
    points = _strict_json(res.stdout)["scaling"]  # type: ignore[index]
    assert [p["tokens_per_s"] is None for p in points] == [False, True]
    out = tmp_path / "none"
    res = runner.invoke(app, [*argv, "--scaling", "7", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "scaling.csv").is_file() and not (out / "scaling.svg").exists()
    _strict_json((out / "results.json").read_text())


#: The issue's case: three runs on 64 H100s whose global batches differ (512, 8 and 128 sequences).
# DeepSpeed's bf16 gradients: under Megatron-LM's fp32 grad buffer (the default framework) 13B on one GPU does not fit
BATCHES = ["dp=64,micro_batch=1,global_batch=512,zero=1,remat=selective,framework=deepspeed", "tp-node-dp", "zero3"]
ISSUE = ["compare", "--model", "gpt3-13b", "-H", "dgx-h100", "--gpus", "64", "-s", BATCHES[0], "-s", BATCHES[1],
         "-s", BATCHES[2], "--engine", "analytic"]  # fmt: skip


def _alone(strategy: str) -> tuple[float, float, float, int]:
    """tokens/s, step time, GPU-seconds per token and the global batch of one run, simulated on its own."""
    cluster = load_hardware("dgx-h100", gpus=64)
    s = as_strategy(strategy)
    r = simulate_analytic(load_model("gpt3-13b"), cluster, s)
    tokens = r.tokens_per_s * r.step_time_s
    return r.tokens_per_s, r.step_time_s, r.step_time_s * r.gpus / tokens, s.resolve(cluster).batch


def test_compare_ranks_by_tokens_per_s_by_default() -> None:
    """The best run is the one with the most tokens/s (not the shortest step), its margin is the ratio of the
    runs' own tokens/s, and the table shows each run's global batch."""
    alone = {s: _alone(s) for s in BATCHES}
    res = runner.invoke(app, ISSUE, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    by_tokens = sorted(BATCHES, key=lambda s: -alone[s][0])
    assert by_tokens[0] == BATCHES[0] and min(BATCHES, key=lambda s: alone[s][1]) == "tp-node-dp"  # the trap
    summary = " ".join(res.stdout.split())
    assert summary.count("Best by tokens/s: dp64 tp1 pp1 mb1 zero1 remat=selective nccl under deepspeed,") == 1
    gain = alone[by_tokens[0]][0] / alone[by_tokens[1]][0] - 1
    assert f"It gives {gain:.1%} more tokens/s than {by_tokens[1]} (global batch 512 vs 128)" in summary
    assert "faster" not in summary
    header = next(line for line in res.stdout.splitlines() if "global batch" in line)
    assert [c.strip() for c in header.split("┃")[1:5]] == ["#", "run", "GPUs", "global batch"]
    labels = dict(
        zip(
            BATCHES, ["dp64 tp1 pp1 mb1 zero1 remat=selective nccl under deepspeed", "tp-node-dp", "zero3"], strict=True
        )
    )
    for rank, strategy in enumerate(by_tokens, start=1):
        row = next(line for line in res.stdout.splitlines() if f" {labels[strategy]} " in line)
        cells = [c.strip() for c in row.split("│")]
        assert cells[1:5] == [str(rank), labels[strategy], "64", f"{alone[strategy][3]:,}"]


def test_compare_objective_option_takes_the_planners_names() -> None:
    alone = {s: _alone(s) for s in BATCHES}
    step = runner.invoke(app, [*ISSUE, "--objective", "step_time"])
    assert step.exit_code == 0, step.output
    text = " ".join(step.stdout.split())
    assert "Best by step time: tp-node-dp," in text and "The global batches differ (8, 128, 512)" in text
    cost = runner.invoke(app, [*ISSUE, "--objective", "cost", "--format", "json"])
    assert cost.exit_code == 0, cost.output
    data = json.loads(cost.stdout)
    cheapest = min(BATCHES, key=lambda s: alone[s][2])
    assert data["objective"] == "cost" and data["best"] == {
        BATCHES[0]: "dp64 tp1 pp1 mb1 zero1 remat=selective nccl under deepspeed"
    }.get(cheapest, cheapest)
    assert data["fastest"] == "tp-node-dp"
    bad = runner.invoke(app, [*ISSUE, "--objective", "fastest"])
    assert bad.exit_code == 2 and bad.stderr.strip() == (
        "error: --objective fastest: choose one of tokens_per_s, step_time, cost"
    )
