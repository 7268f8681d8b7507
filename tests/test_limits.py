"""Numbers, sizes and the Python API's boundary: every number has a range (plansim.limits), checked before any work
with a one-line message; work is estimated before it starts and refused above a bound the user can raise; every bad
argument of the public API is a PlansimError with the CLI's message, never a TypeError from deep inside."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import plansim
from plansim.cli.app import app
from plansim.errors import PlansimError
from plansim.limits import LIMITS, WORK

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> tuple[int, str]:
    """Exit code and the error line of a CLI run, timed: nothing here may take long."""
    began = time.perf_counter()
    result = runner.invoke(app, list(args))
    assert time.perf_counter() - began < 30, args
    return result.exit_code, result.output.strip().splitlines()[-1] if result.output.strip() else ""


def assert_one_line_error(args: tuple[str, ...], *words: str) -> None:
    code, line = cli(*args)
    assert code == 2, (args, line)
    assert line.startswith("error: "), line
    for w in words:
        assert w in line, (w, line)


# ---- the table and its page ------------------------------------------------------------------------------------


def test_every_limit_and_work_bound_is_documented_with_its_range() -> None:
    page = (ROOT / "docs" / "limits.md").read_text()
    for key, limit in LIMITS.items():
        row = next((line for line in page.splitlines() if line.startswith(f"| `{key}`")), None)
        assert row is not None, f"docs/limits.md lacks {key}"
        assert row.split("|")[3].strip() == limit.describe(), (key, limit.describe(), row)
    for work in WORK.values():
        assert work.env in page and f"{work.default:,}" in page
    assert "docs/limits.md" in (ROOT / "README.md").read_text() + (ROOT / "docs" / "README.md").read_text()


# ---- the commands: one line each, at once ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("plan", "-m", "gpt3-125m", "--global-batch", "9223372036854775808"), ("--global-batch", "16,777,216")),
        (("plan", "-m", "gpt3-125m", "-g", "16", "-B", "1000000000"), ("--global-batch", "at most")),
        (("plan", "-m", "gpt3-125m", "-B", "16", "--tokens", "nan"), ("--tokens nan", "finite")),
        (("plan", "-m", "gpt3-125m", "-B", "16", "--jobs", "0"), ("--jobs 0", "at least 1")),
        (("plan", "-m", "gpt3-125m", "-B", "16", "--top", "0"), ("--top 0",)),
        (("plan", "-m", "gpt3-125m", "-B", "16", "--price-per-gpu-hour", "inf", "--tokens", "1e9"), ("--price",)),
        (
            ("simulate", "-m", "gpt3-125m", "-H", "dgx-a100", "-s", "dp=8", "--gpus", "18446744073709551616"),
            ("--gpus 18446744073709551616", "1,048,576"),
        ),
        (
            ("simulate", "-m", "gpt3-125m", "-H", "dgx-a100", "-s", "dp=8", "-e", "des", "--jitter", "1e308"),
            ("--jitter", "at most 1"),
        ),
        (
            ("simulate", "-m", "gpt3-125m", "-H", "dgx-a100", "-s", "dp=8", "-e", "des", "--straggler", "3=nan"),
            ("--straggler 3=nan",),
        ),
        (
            ("simulate", "-m", "gpt3-125m", "-H", "dgx-a100", "-s", "dp=8", "-e", "des", "--seed", "-1"),
            ("--seed -1",),
        ),
        (("simulate", "-m", "gpt3-125m", "-H", "dgx-a100", "-s", "dp=1e30"), ("'dp'", "1048576", "docs/limits.md")),
        (("simulate", "-m", "gpt3-125m", "-H", "dgx-a100", "-s", "dp=8,micro_batch=inf"), ("'micro_batch'",)),
    ],
)
def test_out_of_range_numbers_are_one_line_before_any_work(args: tuple[str, ...], words: tuple[str, ...]) -> None:
    assert_one_line_error(args, *words)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("layers", "1e30", ("'layers'", "10000")),
        ("layers", "1" + "0" * 400, ("'layers'", "10000")),
        ("hidden", "9" * 5000, ("digits",)),
        ("vocab", ".nan", ("'vocab'",)),
        ("seq_len", "2e9", ("'seq_len'", "16777216")),
        ("ffn_hidden", "1e400", ("'ffn_hidden'",)),
    ],
)
def test_absurd_model_file_numbers_are_one_line(tmp_path: Path, key: str, value: str, words: tuple[str, ...]) -> None:
    fields = {"name": "huge", "family": "gpt", "layers": "2", "hidden": "64", "heads": "4", "seq_len": "16",
              "vocab": "100"}  # fmt: skip
    fields[key] = value
    path = tmp_path / "m.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in fields.items()))
    for command in (("simulate", "-m", str(path), "-H", "dgx-a100", "-s", "dp=8"),
                    ("plan", "-m", str(path), "-B", "16", "--no-des"),
                    ("remat", "-m", str(path), "-b", "1GB")):  # fmt: skip
        assert_one_line_error(command, str(path), *words)


def test_divisors_of_huge_numbers_are_immediate() -> None:
    from plansim.planner.space import divisors

    began = time.perf_counter()
    assert len(divisors(2**63)) == 64
    assert divisors(14_414_400)[-3:] == [4_804_800, 7_207_200, 14_414_400]
    assert time.perf_counter() - began < 1


# ---- sizes: linear in dp, work estimated first ------------------------------------------------------------------


def test_pure_data_parallelism_at_65536_gpus_is_priced_quickly() -> None:
    import tracemalloc

    tracemalloc.start()
    try:
        began = time.perf_counter()
        r = plansim.simulate("gpt3-125m", "dgx-a100", "dp=65536,micro_batch=1,global_batch=65536", gpus=65536)
        elapsed, peak = time.perf_counter() - began, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.gpus == 65536 and r.step_time_s > 0
    assert elapsed < 20 and peak < 200e6  # the ring's steps as arrays would be 65535 x 65536 numbers each


def test_same_figures_across_data_parallel_degrees_as_closed_forms() -> None:
    """The ring all-reduce per GPU sends 2 (p-1)/p of the gradients (Patarasuk & Yuan 2009): at any dp."""
    small = plansim.simulate("gpt3-125m", "dgx-a100", "dp=1024,micro_batch=1,global_batch=1024", gpus=1024)
    large = plansim.simulate("gpt3-125m", "dgx-a100", "dp=16384,micro_batch=1,global_batch=16384", gpus=16384)
    ratio = large.comm_bytes_per_gpu["dp"] / small.comm_bytes_per_gpu["dp"]
    assert ratio == pytest.approx((16383 / 16384) / (1023 / 1024), rel=1e-12)


def test_full_mode_des_above_the_bound_names_symmetric_mode_and_the_variable() -> None:
    args = ("simulate", "-m", "gpt3-125m", "-H", "dgx-a100", "-g", "16384", "-s",
            "dp=16384,micro_batch=1,global_batch=16384", "--engine", "des", "--mode", "full")  # fmt: skip
    assert_one_line_error(args, "--mode symmetric", "PLANSIM_MAX_DES_TASKS")


def test_the_des_bound_is_raised_or_lowered_by_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    strategy = "dp=2,tp=2,pp=2,micro_batch=1,global_batch=32"
    r = plansim.simulate("gpt3-125m", "dgx-a100", strategy, engine="des", mode="full")
    assert r.fits is not None
    monkeypatch.setenv("PLANSIM_MAX_DES_TASKS", "1000")
    with pytest.raises(PlansimError, match=r"about [\d,]+ tasks and transfers, above the bound of 1,000"):
        plansim.simulate("gpt3-125m", "dgx-a100", strategy, engine="des", mode="full")
    monkeypatch.setenv("PLANSIM_MAX_DES_TASKS", "lots")
    with pytest.raises(PlansimError, match="PLANSIM_MAX_DES_TASKS=lots: expected a whole number"):
        plansim.simulate("gpt3-125m", "dgx-a100", strategy, engine="des")


def test_des_estimate_is_the_lowered_count() -> None:
    """The extrapolation in the micro-batches is exact: the lowering's tasks are linear in them."""
    from plansim.api import as_strategy
    from plansim.des import size
    from plansim.des.lower import lower
    from plansim.hardware import load_hardware
    from plansim.workload import load_model

    cl, spec = load_hardware("dgx-a100", gpus=16), load_model("gpt3-125m")
    for text in ("dp=2,tp=2,pp=4,micro_batch=1,global_batch=64,sequence_parallel=true,remat=full",
                 "dp=4,pp=4,micro_batch=1,global_batch=96,schedule=interleaved,virtual_stages=3,zero=1"):  # fmt: skip
        s = as_strategy(text).resolve(cl)
        k = s.pp
        low, high = (size.des_work(lower(spec, cl, size._with_microbatches(s, n)), cl, "full") for n in (k, 2 * k))
        estimate = low + (high - low) / k * (s.num_microbatches - k)
        assert estimate == size.des_work(lower(spec, cl, s), cl, "full")


def test_plan_counts_candidates_before_pricing_and_names_how_to_raise_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from plansim.hardware import load_hardware
    from plansim.planner.space import candidates, count_candidates
    from plansim.workload import load_model

    spec, cl = load_model("gpt3-350m"), load_hardware("dgx-a100", gpus=16)
    n = count_candidates(spec, cl, 96)
    assert n == sum(1 for _ in candidates(spec, cl, 96))
    monkeypatch.setenv("PLANSIM_MAX_CANDIDATES", str(n - 1))
    began = time.perf_counter()
    with pytest.raises(PlansimError, match=f"about {n:,} candidate strategies.*--tp.*PLANSIM_MAX_CANDIDATES="):
        plansim.plan("gpt3-350m", "dgx-a100", gpus=16, global_batch=96, des=False)
    assert time.perf_counter() - began < 5
    code, line = cli("plan", "-m", "gpt3-1.3b", "-g", "16", "-B", "14414400")
    assert code == 2 and "PLANSIM_MAX_CANDIDATES" in line


# ---- the Python API: ~100 bad calls, each a PlansimError at once -------------------------------------------------

NAN, INF = float("nan"), float("inf")
SIM = {"model": "gpt3-125m", "hardware": "dgx-a100", "strategy": "dp=8"}
PLAN = {"model": "gpt3-125m", "hardware": "dgx-a100", "gpus": 8, "global_batch": 16, "des": False, "milp": False}
CMP = {"model": "gpt3-125m", "strategies": ["dp=8"], "engine": "analytic"}


def _sim(**kw: Any) -> Any:
    return plansim.simulate(**{**SIM, **kw})


def _des(**kw: Any) -> Any:
    return plansim.simulate(**{**SIM, "engine": "des", **kw})


def _plan(**kw: Any) -> Any:
    return plansim.plan(**{**PLAN, **kw})


def _compare(**kw: Any) -> Any:
    return plansim.compare(**{**CMP, **kw})


def _remat_graph(**kw: Any) -> Any:
    from plansim.remat.api import remat_graph

    return remat_graph(**{"model": "gpt3-125m", "stage_layers": 1, "granularity": "layer", **kw})


def _solve(**kw: Any) -> Any:
    from plansim.remat.graph import linear_chain

    return plansim.solve_remat(**{"graph": linear_chain(4), **kw})


def _sweep(**kw: Any) -> Any:
    from plansim.sweep import SweepGrid, sweep

    return sweep(**{"grid": SweepGrid(("gpt3-125m",), ("dgx-a100",), (8,), (16,)), **kw})


def _grid(**kw: Any) -> Any:
    from plansim.sweep import SweepGrid

    return SweepGrid(**{"models": ("gpt3-125m",), "hardware": ("dgx-a100",), "gpus": (8,), "global_batches": (16,),
                        **kw})  # fmt: skip


BAD_CALLS: list[tuple[str, Any]] = [
    *[(f"simulate(model={v!r})", lambda v=v: _sim(model=v)) for v in (None, 3, [], {}, "", 1.5)],
    *[(f"simulate(hardware={v!r})", lambda v=v: _sim(hardware=v)) for v in (None, 8, [], "", "dgx-z900")],
    *[
        (f"simulate(strategy={v!r})", lambda v=v: _sim(strategy=v))
        for v in (None, 8, ["dp=8"], {"dp": "x"}, {"dp": NAN}, {"colour": 1}, {"dp": 10**30}, "dp=inf", "", 2.5)
    ],
    *[
        (f"simulate(gpus={v!r})", lambda v=v: _sim(strategy="tp=8", gpus=v))
        for v in (0, -1, 10**12, 2**64, NAN, INF, 8.5, "8", True, [8])
    ],
    ("simulate(gpus=10**5000)", lambda: _sim(strategy="tp=8", gpus=10**5000)),
    *[(f"simulate(engine={v!r})", lambda v=v: _sim(engine=v)) for v in (None, 3, "fast", ["des"])],
    *[(f"simulate(mode={v!r})", lambda v=v: _des(mode=v)) for v in (3, "half", ["full"])],
    *[
        (f"simulate(stragglers={v!r})", lambda v=v: _des(stragglers=v))
        for v in ({0: NAN}, {0: INF}, {0: -1}, {"x": 1.5}, {99: 1.5}, [1.5], "0=1.5", {0: "slow"}, {1.5: 2.0})
    ],
    *[
        (f"simulate(link_factors={v!r})", lambda v=v: _des(link_factors=v))
        for v in (
            {"node0/nic0": NAN},
            {"node0/nic0": 0},
            {"node0/nic0": 1e308},
            {3: 0.5},
            ["node0/nic0"],
            "node0/nic0=1",
            {"nowhere": 0.5},
        )
    ],
    *[(f"simulate(failed_links={v!r})", lambda v=v: _des(failed_links=v)) for v in (3, [3], {"a": 1}, "nowhere")],
    *[(f"simulate(jitter={v!r})", lambda v=v: _des(jitter=v)) for v in (NAN, INF, -1, 1e308, "0.1", True, [0.1])],
    *[(f"simulate(seed={v!r})", lambda v=v: _des(seed=v)) for v in (-1, 2**70, 1.5, "x", NAN)],
    ("simulate(analytic, jitter=0.1)", lambda: _sim(jitter=0.1)),
    *[
        (f"plan(global_batch={v!r})", lambda v=v: _plan(global_batch=v))
        for v in (NAN, INF, 0, -1, 2**63, "16", 16.5, None, True)
    ],
    *[(f"plan(gpus={v!r})", lambda v=v: _plan(gpus=v)) for v in (0, 10**12, 2**64, NAN, "8", 12)],
    *[
        (f"plan(constraints={v!r})", lambda v=v: _plan(constraints=v))
        for v in (
            {"colour": 1},
            {"tp": "x"},
            {"tp": NAN},
            {"tp": 0},
            {"tp": 10**30},
            5,
            "tp=2",
            ["tp"],
            {"remat": 3},
            {"remat": "milp"},
            {"zero": 5},
            {"zero": True},
            {"schedule": 3},
            {"dp_algorithms": [3]},
            {"sequence_parallel": "yes"},
            {"dtype": "fp64"},
            {"allow_cross_node_tp": None},
        )
    ],
    *[(f"plan(objective={v!r})", lambda v=v: _plan(objective=v)) for v in (None, 3, "fast")],
    *[(f"plan(top_k={v!r})", lambda v=v: _plan(top_k=v)) for v in (0, -1, NAN, 10**9, "3")],
    *[(f"plan(jobs={v!r})", lambda v=v: _plan(jobs=v)) for v in (0, -1, 1.5, 10**6, "2")],
    *[(f"plan(tokens={v!r})", lambda v=v: _plan(tokens=v)) for v in (NAN, INF, -1, 0, "1e9")],
    *[
        (f"plan(price_per_gpu_hour={v!r})", lambda v=v: _plan(tokens=1e9, price_per_gpu_hour=v))
        for v in (NAN, -1, INF, "2")
    ],
    *[(f"plan(des={v!r})", lambda v=v: _plan(des=v)) for v in ("yes", None)],
    ("plan(progress=3)", lambda: _plan(progress=3)),
    ("plan(model=None)", lambda: _plan(model=None)),
    *[
        (f"Constraints({k}={v!r})", lambda k=k, v=v: plansim.Constraints(**{k: v}))
        for k, v in (("tp", NAN), ("pp", -2), ("max_micro_batch", 10**40), ("remat", 3), ("zero", "1"))
    ],
    *[(f"compare(strategies={v!r})", lambda v=v: _compare(strategies=v)) for v in (None, [], [None], [3], 3)],
    *[(f"compare(hardware={v!r})", lambda v=v: _compare(hardware=v)) for v in (None, 3, [None], [])],
    *[(f"compare(gpus={v!r})", lambda v=v: _compare(gpus=v)) for v in (0, NAN, 10**12, "8")],
    *[(f"compare(engine={v!r})", lambda v=v: _compare(engine=v)) for v in ("x", None)],
    *[
        (f"compare(scaling_gpus={v!r})", lambda v=v: _compare(scaling_gpus=v))
        for v in ([0], [NAN], "8", ["8"], [10**12], 8.5)
    ],
    ("compare(scaling_batch=3)", lambda: _compare(scaling_batch=3)),
    ("compare(progress=3)", lambda: _compare(progress=3)),
    *[(f"load_model({v!r})", lambda v=v: plansim.load_model(v)) for v in (None, 3, "", "nope", [])],
    *[(f"load_hardware({v!r})", lambda v=v: plansim.load_hardware(v)) for v in (None, 3, "nope")],
    *[
        (f"load_hardware(gpus={v!r})", lambda v=v: plansim.load_hardware("dgx-a100", gpus=v))
        for v in (0, NAN, 10**12, "8", 2**64)
    ],
    *[
        (f"Strategy.parse({v!r})", lambda v=v: plansim.Strategy.parse(v))
        for v in (None, 3, "", "dp=nan", "dp=1e30", "dp=inf", "dp=-1", "layer_split=1e30")
    ],
    ("Strategy.parse('dp=' + 5000 digits)", lambda: plansim.Strategy.parse("dp=" + "9" * 5000)),
    ("plan(gpus=2**20, global_batch=3)", lambda: _plan(gpus=2**20, global_batch=3)),
    *[(f"load_strategy({v!r})", lambda v=v: plansim.load_strategy(v)) for v in (None, 3)],
    *[(f"solve_remat(budget_bytes={v!r})", lambda v=v: _solve(budget_bytes=v)) for v in (NAN, -1, INF, "1GB")],
    *[
        (f"solve_remat({k}={v!r})", lambda k=k, v=v: _solve(**{k: v}))
        for k, v in (
            ("graph", None),
            ("method", 3),
            ("method", ["milp"]),
            ("in_flight", 0),
            ("in_flight", NAN),
            ("time_limit_s", NAN),
            ("time_limit_s", -1),
            ("gap", 2),
            ("gap", NAN),
            ("solver", "gurobi"),
        )
    ],
    *[
        (f"remat_graph({k}={v!r})", lambda k=k, v=v: _remat_graph(**{k: v}))
        for k, v in (
            ("model", 3),
            ("stage_layers", 0),
            ("stage_layers", NAN),
            ("stage_layers", 10**9),
            ("micro_batch", 0),
            ("micro_batch", NAN),
            ("tp", 0),
            ("tp", 5),
            ("granularity", 3),
            ("granularity", ["op"]),
        )
    ],
    *[
        (f"sweep({k}={v!r})", lambda k=k, v=v: _sweep(**{k: v}))
        for k, v in (
            ("grid", None),
            ("grid", {"model": "gpt3-125m"}),
            ("jobs", 0),
            ("jobs", NAN),
            ("settings", 3),
            ("progress", 3),
        )
    ],
    *[
        (f"SweepGrid({k}={v!r})", lambda k=k, v=v: _grid(**{k: v}))
        for k, v in (
            ("gpus", (0,)),
            ("gpus", (NAN,)),
            ("gpus", (10**12,)),
            ("global_batches", (2**63,)),
            ("models", (3,)),
            ("models", None),
        )
    ],
]


def test_there_are_about_a_hundred_bad_calls() -> None:
    assert len(BAD_CALLS) >= 100


@pytest.mark.parametrize("call", [c for _, c in BAD_CALLS], ids=[name for name, _ in BAD_CALLS])
def test_a_bad_api_call_is_a_plansim_error_at_once(call: Any) -> None:
    began = time.perf_counter()
    with pytest.raises(PlansimError) as info:
        call()
    assert time.perf_counter() - began < 10
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message
    assert type(info.value) is PlansimError


def test_one_failed_link_as_a_string_is_one_link() -> None:
    one = plansim.simulate(**SIM, engine="des", failed_links="node0/nic0")
    listed = plansim.simulate(**SIM, engine="des", failed_links=["node0/nic0"])
    assert one.step_time_s == listed.step_time_s


def test_constraints_may_be_a_mapping_of_their_fields() -> None:
    as_dict = _plan(constraints={"tp": 2, "remat": "none", "dp_algorithms": ("ring",)})
    as_object = _plan(constraints=plansim.Constraints(tp=2, remat=("none",), dp_algorithms=("ring",)))
    assert as_dict.winner == as_object.winner and as_dict.winner is not None and as_dict.winner.tp == 2


def test_the_api_and_the_cli_give_the_same_message() -> None:
    with pytest.raises(PlansimError) as info:
        plansim.plan("gpt3-125m", "dgx-a100", global_batch=16, jobs=0)
    code, line = cli("plan", "-m", "gpt3-125m", "-B", "16", "--jobs", "0")
    assert code == 2 and line == f"error: {info.value}"


def test_api_docstrings_say_what_they_raise() -> None:
    for f in (plansim.simulate, plansim.plan):
        assert re.search(r"Raises\s+-+\s+PlansimError", f.__doc__ or ""), f


@pytest.mark.parametrize(
    ("kind", "key", "value"),
    [
        ("gpus", "memory_bytes", "1" + "0" * 400),
        ("gpus", "hbm_bandwidth_Bps", "1e300"),
        ("gpus", "kernel_launch_s", ".inf"),
        ("nodes", "gpus_per_node", "1e30"),
    ],
)
def test_absurd_hardware_file_numbers_are_one_line(tmp_path: Path, kind: str, key: str, value: str) -> None:
    for folder in ("gpus", "nodes"):
        (tmp_path / folder).mkdir()
    gpu = ROOT / "hardware_profiles" / "gpus" / "a100-sxm4-80gb.yaml"
    node = ROOT / "hardware_profiles" / "nodes" / "dgx-a100.yaml"
    for source, folder in ((gpu, "gpus"), (node, "nodes")):
        text = source.read_text()
        if folder == kind:
            text = re.sub(rf"(?m)^{key}:.*$", f"{key}: {value}", text)
        (tmp_path / folder / source.name).write_text(text)
    assert_one_line_error(
        ("simulate", "-m", "gpt3-125m", "-H", str(tmp_path / "nodes" / node.name), "-s", "dp=8"), f"'{key}'"
    )


def test_a_65536_way_ring_in_the_des_is_refused_naming_the_analytic_engine() -> None:
    """Its schedule alone holds 2 x 65535 x 65536 transfers when built (tens of GB)."""
    args = ("simulate", "-m", "gpt3-125m", "-H", "dgx-a100", "-g", "65536", "-s",
            "dp=65536,micro_batch=1,global_batch=65536", "--engine", "des")  # fmt: skip
    assert_one_line_error(args, "--engine analytic", "PLANSIM_MAX_DES_TASKS")
