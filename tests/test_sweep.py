"""``plansim sweep``: the grid parses (and fails in one line), the DataFrame is the same whichever executor ran it
(serial, joblib, a Dask LocalCluster), each row is what ``plan()`` says for that point on its own, and the CLI
writes its files and fails in one line (Dask missing included)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest
from pandas.testing import assert_frame_equal
from typer.testing import CliRunner

from plansim.cli.app import app
from plansim.errors import PlansimError
from plansim.hardware import load_hardware
from plansim.planner import plan
from plansim.planner.explain import describe
from plansim.sweep import COLUMNS, SweepGrid, SweepSettings, grid_from_options, load_grid, parse_grid, sweep
from plansim.sweep.executors import DASK_MISSING, run_dask
from plansim.sweep.grid import Point
from plansim.sweep.point import run_point
from plansim.workload import load_model

#: its module-scoped fixtures computed once: every test here on one pytest-xdist worker (--dist loadgroup)
pytestmark = pytest.mark.xdist_group("test_sweep")

runner = CliRunner()

#: Two planner runs and two GPU counts a DGX cannot be sized to (12 is not a whole number of 8-GPU nodes).
GRID = SweepGrid(("gpt3-125m", "gpt3-350m"), ("dgx-a100",), (8, 12), (32,))
#: Points that cannot be sized (no planner run): instant.
UNSIZED = SweepGrid(("gpt3-125m",), ("dgx-a100",), (12, 20, 36), (32,))


@pytest.fixture(scope="module")
def serial() -> pd.DataFrame:
    return sweep(GRID).frame()


# --- the grid ---------------------------------------------------------------------------------------------------


def test_grid_is_the_product_in_grid_order() -> None:
    grid = parse_grid(" gpt3-125m, gpt3-350m ", "8,16,32", "64,128", "dgx-a100,dgx-h100")
    assert len(grid) == 2 * 2 * 3 * 2
    points = grid.points()
    assert [p.index for p in points] == list(range(len(grid)))
    expected = [(m, h, g, b) for m in ("gpt3-125m", "gpt3-350m") for h in ("dgx-a100", "dgx-h100")
                for g in (8, 16, 32) for b in (64, 128)]  # fmt: skip
    assert [(p.model.name, p.node.name, p.gpus, p.global_batch) for p in points] == expected
    assert parse_grid("gpt3-125m", "8", "64").hardware == ("dgx-a100",)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("gpt3-125m", "8,x", "64"), ["--gpus 8,x", "whole numbers", "--gpus 8,16,32"]),
        (("gpt3-125m", "8,0", "64"), ["--gpus 0", "positive"]),
        (("gpt3-125m", "8", "64,-2"), ["--global-batch -2", "positive"]),
        (("gpt3-125m", "8,16,8", "64"), ["--gpus", "8 is listed twice"]),
        ((" , ", "8", "64"), ["--model", "at least one value"]),
        (("gpt3-125m", "8", ""), ["--global-batch", "at least one value"]),
    ],
)
def test_grid_lists_fail_in_one_line(args: tuple[str, str, str], words: list[str]) -> None:
    with pytest.raises(PlansimError) as err:
        parse_grid(*args)
    assert "\n" not in str(err.value)
    for w in words:
        assert w in str(err.value)


def test_unknown_model_or_hardware_fails_before_anything_runs() -> None:
    with pytest.raises(PlansimError, match="unknown model 'gpt9'"):
        sweep(parse_grid("gpt3-125m,gpt9", "8", "64"))
    with pytest.raises(PlansimError, match="dgx-z9"):
        sweep(parse_grid("gpt3-125m", "8", "64", "dgx-z9"))


def test_grid_file_equals_the_lists(tmp_path: Path) -> None:
    path = tmp_path / "grid.yaml"
    path.write_text("model: [gpt3-125m, gpt3-350m]\nhardware: dgx-h100\ngpus: [8, 16]\nglobal_batch: 64\n")
    assert load_grid(path) == parse_grid("gpt3-125m,gpt3-350m", "8,16", "64", "dgx-h100")
    path.write_text("model: gpt3-125m\ngpus: 8\nglobal_batch: 64\n")
    assert load_grid(path).hardware == ("dgx-a100",)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("model: gpt3-125m\ngpus: [8]\nglobal_batch: [64]\ncolour: red\n", ["'colour'", "unknown key"]),
        ("model: gpt3-125m\ngpus: [eight]\nglobal_batch: [64]\n", ["'gpus.0'", "integer"]),
        ("model: gpt3-125m\nglobal_batch: [64]\n", ["'gpus'", "missing"]),
        ("model: gpt3-125m\ngpus: [8, 8]\nglobal_batch: [64]\n", ["field 'gpus'", "listed twice"]),
        ("model: gpt3-125m\ngpus: [8]\nglobal_batch: [0]\n", ["field 'global_batch'", "global_batch: [64, 128]"]),
        ("model: [gpt3-125m\n", ["malformed YAML"]),
    ],
)
def test_grid_file_errors_name_file_and_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, words: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # a short name, whole in the message however deep the test's folder is
    path = Path("grid.yaml")
    path.write_text(text)
    with pytest.raises(PlansimError) as err:
        load_grid(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    for w in words:
        assert w in message


def test_grid_options_need_the_lists_or_a_file_not_both(tmp_path: Path) -> None:
    with pytest.raises(PlansimError, match=r"^--gpus, --global-batch: needed"):
        grid_from_options("gpt3-125m", None, None, None, None)
    with pytest.raises(PlansimError, match=r"^--grid and --model: give the grid file or the lists, not both"):
        grid_from_options("gpt3-125m", None, None, None, str(tmp_path / "grid.yaml"))
    with pytest.raises(PlansimError, match="not found"):
        grid_from_options(None, None, None, None, str(tmp_path / "missing.yaml"))


# --- the same DataFrame whatever the executor ---------------------------------------------------------------------


def test_frame_has_its_columns_dtypes_and_grid_order(serial: pd.DataFrame) -> None:
    assert list(serial.columns) == list(COLUMNS)
    assert {c: str(t) for c, t in serial.dtypes.items()} == COLUMNS
    assert list(zip(serial["model"], serial["gpus"], strict=True)) == [
        (m, g) for m in ("gpt3-125m", "gpt3-350m") for g in (8, 12)
    ]
    assert list(serial["fits"]) == [True, False] * 2


def test_joblib_gives_the_same_frame(serial: pd.DataFrame) -> None:
    assert_frame_equal(sweep(GRID, jobs=2).frame(), serial)


def test_dask_local_cluster_gives_the_same_frame(serial: pd.DataFrame) -> None:
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c:
        by_address = sweep(GRID, scheduler=c.scheduler_address)
        with distributed.Client(c, set_as_default=False) as client:
            by_client = sweep(UNSIZED, scheduler=client)  # a connected client is used as it is
            assert client.status == "running"
    assert by_address.executor.startswith("dask")
    assert_frame_equal(by_address.frame(), serial)
    assert_frame_equal(by_client.frame(), sweep(UNSIZED).frame())


def test_rows_arriving_out_of_order_are_sorted_back() -> None:
    from plansim.sweep.point import rows_frame

    rows = [run_point(p, SweepSettings()) for p in UNSIZED.points()]
    assert_frame_equal(rows_frame(rows[::-1]), rows_frame(rows))
    assert list(rows_frame(rows[::-1])["gpus"]) == [12, 20, 36]


def test_progress_reaches_every_point() -> None:
    calls: list[tuple[int, int]] = []
    sweep(UNSIZED, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(1, 3), (2, 3), (3, 3)]


# --- each row is plan() on that point -----------------------------------------------------------------------------


def test_each_row_is_plan_on_that_point(serial: pd.DataFrame) -> None:
    for row in serial.to_dict("records"):
        if row["gpus"] == 12:  # a DGX holds 8: the row carries load_hardware's own message
            with pytest.raises(PlansimError) as err:
                load_hardware(row["hardware"], gpus=12)
            assert row["reason"] == str(err.value) and row["candidates"] == 0
            continue
        r = plan(row["model"], row["hardware"], gpus=row["gpus"], global_batch=row["global_batch"], des=False,
                 milp=False)  # fmt: skip
        w, figures = r.winner, r.winner_result
        assert w is not None and figures is not None
        assert row["strategy"] == describe(w)
        assert (row["dp"], row["tp"], row["pp"], row["micro_batch"], row["zero"], row["remat"]) == (
            w.dp, w.tp, w.pp, w.micro_batch, w.zero, w.remat,
        )  # fmt: skip
        assert row["step_time_s"] == figures.step_time_s and row["mfu"] == figures.mfu
        assert row["peak_memory_bytes"] == figures.peak_memory_bytes
        assert (row["candidates"], row["fitting"], row["engine"]) == (r.outcome.candidates, r.outcome.fit_count,
                                                                      "analytic")  # fmt: skip
        # invariants that need no planner: the GPUs are used, the batch is covered, tokens/s is batch x seq / step
        assert row["dp"] * row["tp"] * row["pp"] == row["gpus"]
        assert row["dp"] * row["micro_batch"] * row["num_microbatches"] == row["global_batch"]
        seq = load_model(row["model"]).seq_len
        assert row["tokens_per_s"] == pytest.approx(row["global_batch"] * seq / row["step_time_s"], rel=1e-12)
        assert row["peak_memory_bytes"] <= row["memory_capacity_bytes"] and row["reason"] == ""


def test_nothing_fits_row_carries_the_planner_explanation() -> None:
    model, node = load_model("gpt3-13b"), load_hardware("pcie-4x4090")
    _, row = run_point(Point(0, model, node, 4, 32), SweepSettings())
    r = plan("gpt3-13b", "pcie-4x4090", gpus=4, global_batch=32, des=False, milp=False)
    assert r.winner is None
    assert not row["fits"] and row["reason"] == r.explanation and "Smallest change" in row["reason"]
    assert row["candidates"] == r.outcome.candidates > 0 and row["fitting"] == 0
    assert row["strategy"] is None and row["step_time_s"] is None


def test_settings_are_checked() -> None:
    with pytest.raises(PlansimError, match="--top 0"):
        SweepSettings(top_k=0)
    with pytest.raises(PlansimError, match="--objective speed: choose one of step_time"):
        SweepSettings(objective="speed")
    with pytest.raises(PlansimError, match="--jobs 0"):
        sweep(GRID, jobs=0)
    with pytest.raises(PlansimError, match="--jobs and --scheduler: give one"):
        sweep(GRID, jobs=2, scheduler="tcp://127.0.0.1:8786")


# --- Dask optional, unreachable schedulers ----------------------------------------------------------------------


def test_missing_dask_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "distributed", None)  # `import distributed` now raises ImportError
    res = runner.invoke(app, ["sweep", "-m", "gpt3-125m", "-g", "8", "-B", "32", "--out", "unused",
                              "--scheduler", "tcp://127.0.0.1:8786"])  # fmt: skip
    assert res.exit_code == 2, res.output
    assert res.stderr.strip().splitlines() == [f"error: {DASK_MISSING}"]
    assert "pip install 'plansim[dask]'" in DASK_MISSING


def test_unreachable_scheduler_is_one_line() -> None:
    pytest.importorskip("distributed")
    with pytest.raises(PlansimError) as err:
        run_dask([], SweepSettings(), "tcp://127.0.0.1:1", connect_timeout_s=0.5)
    assert str(err.value).startswith("--scheduler tcp://127.0.0.1:1: cannot reach a Dask scheduler")
    assert "\n" not in str(err.value)


# --- the CLI ------------------------------------------------------------------------------------------------------


def test_cli_writes_csv_and_charts(serial: pd.DataFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import plansim.sweep.output as output

    monkeypatch.setattr(output, "has_parquet", lambda: False)
    argv = ["sweep", "-m", "gpt3-125m", "-g", "8,12", "-B", "32", "--out", str(tmp_path)]
    res = runner.invoke(app, argv)
    assert res.exit_code == 0, res.output
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {"sweep.csv", *(f"scaling_{m}.{e}" for m in ("tokens_per_s", "mfu") for e in ("svg", "png"))}
    said = " ".join(res.stdout.split())  # the console wraps where its width says
    assert "pip install 'plansim[parquet]'" in said and "2 planner runs on serial" in said
    written = pd.read_csv(tmp_path / "sweep.csv", keep_default_na=False)
    direct = serial[serial["model"] == "gpt3-125m"]
    assert list(written.columns) == list(COLUMNS)
    assert list(written["strategy"]) == [v if isinstance(v, str) else "" for v in direct["strategy"]]
    assert list(written["reason"]) == list(direct["reason"])
    assert float(written["step_time_s"][0]) == pytest.approx(float(direct["step_time_s"].iloc[0]), rel=1e-12)


def test_cli_json_from_a_grid_file(tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("model: gpt3-125m\ngpus: [8, 12]\nglobal_batch: 32\n")
    res = runner.invoke(app, ["sweep", "--grid", str(grid), "--out", str(tmp_path / "out"), "--format", "json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary["points"] == 2 and summary["fitting_points"] == 1 and summary["executor"] == "serial"
    assert summary["settings"] == {"des": False, "milp": False, "splits": True, "top_k": 10,
                                   "objective": "step_time", "headroom": 0.05}  # fmt: skip
    fits, cannot = summary["rows"]
    assert fits["gpus"] == 8 and fits["dp"] * fits["tp"] * fits["pp"] == 8
    assert cannot["dp"] is None and cannot["step_time_s"] is None and "whole number of nodes" in cannot["reason"]
    assert str(tmp_path / "out" / "sweep.csv") in summary["files"]


def test_parquet_holds_the_same_frame(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    from plansim.sweep.output import write_sweep

    s = sweep(SweepGrid(("gpt3-125m",), ("dgx-a100",), (8, 12), (32,)))
    assert tmp_path / "sweep.parquet" in write_sweep(s, tmp_path)
    read = pd.read_parquet(tmp_path / "sweep.parquet")
    assert {c: str(t) for c, t in read.dtypes.items() if COLUMNS[c] != "object"} == {  # whole numbers stay whole
        c: t for c, t in COLUMNS.items() if t != "object"
    }
    assert_frame_equal(read.astype(COLUMNS), s.frame())  # text reads back as pandas' string dtype


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["-m", "gpt3-125m", "-g", "8"], ["--global-batch: needed"]),
        (["-m", "gpt3-125m", "-g", "8,x", "-B", "32"], ["--gpus 8,x"]),
        (["-m", "gpt3-125m", "-g", "8", "-B", "32", "--jobs", "0"], ["--jobs 0"]),
        (["-m", "gpt3-125m", "-g", "8", "-B", "32", "--objective", "fast"], ["--objective fast"]),
        (["-m", "nope", "-g", "8", "-B", "32"], ["unknown model 'nope'"]),
    ],
    ids=["missing batch", "bad gpus", "bad jobs", "bad objective", "unknown model"],
)
def test_cli_bad_input_is_one_line(tmp_path: Path, argv: list[str], words: list[str]) -> None:
    res = runner.invoke(app, ["sweep", *argv, "--out", str(tmp_path)])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for w in words:
        assert w in lines[0]
