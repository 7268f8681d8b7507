"""Issue 31, files, hangs, tracebacks and unbounded work: every command writes only under its --out and never over
its inputs; FIFOs, devices, sockets, folders and symlink loops are refused without a blocking read; an --out name
too long for the file system, a bad Dask address, too much work or memory are one line before the work; the
Python API's bad calls are one-line PlansimErrors; messages echo values short and say what they are.

Each test reproduces one defect of the issue and checks the fix against an independent truth (the bytes on disk,
a brute-force count, the engine's own estimate). Commands run in-process (typer's CliRunner) on small inputs.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from alarm import alarm
from typer.testing import CliRunner

import plansim
from plansim.cli.app import app
from plansim.errors import PlansimError

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
TINY = "name: tiny\nfamily: gpt\nlayers: 2\nhidden: 256\nheads: 4\nffn_hidden: 1024\nseq_len: 128\nvocab: 1000\n"
LLAMA = json.loads((ROOT / "tests" / "data" / "hf" / "llama-2-7b.json").read_text())


def no_hang(seconds: float = 10.0) -> contextlib.AbstractContextManager[None]:
    """Fail, instead of waiting forever, when the block blocks (a FIFO opened for reading waits for a writer)."""
    return alarm(seconds, "the block")


def cli(*args: str) -> Any:
    """The CLI run in-process, under ``no_hang``."""
    with no_hang(120):
        return runner.invoke(app, [str(a) for a in args])


def one_line_error(result: Any, *words: str) -> str:
    """The error line of a run that must fail with exit 2, one line on stderr, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def raises_one_line(call: Callable[[], Any], *words: str) -> str:
    with no_hang(), pytest.raises(PlansimError) as info:
        call()
    message = str(info.value)
    assert type(info.value) is PlansimError and "\n" not in message and len(message) < 400, message
    for word in words:
        assert word in message, (word, message)
    return message


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder``: its bytes and its modification time (ns)."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()
    }


# ---- 1. validate writes under --out, never into --from --------------------------------------------------------------


def test_validate_from_writes_only_under_out(tmp_path: Path) -> None:
    source = tmp_path / "cpu"
    shutil.copytree(ROOT / "validation" / "cpu", source)
    before = snapshot(source)
    result = cli("validate", "--from", source, "--out", tmp_path / "val")
    assert result.exit_code == 0, result.output
    assert snapshot(source) == before  # not a byte, not a timestamp
    written = sorted(p.name for p in (tmp_path / "val").iterdir())
    assert written == sorted(["environment.json", "measured.csv", "predicted_vs_measured.png",
                              "predicted_vs_measured.svg", "summary.json", "summary.md", "validation.csv"])  # fmt: skip
    # the copies make the folder whole: comparing it again gives the same report
    assert (tmp_path / "val" / "measured.csv").read_bytes() == (source / "measured.csv").read_bytes()
    first = (tmp_path / "val" / "summary.md").read_text()
    assert cli("validate", "--from", tmp_path / "val").exit_code == 0
    assert (tmp_path / "val" / "summary.md").read_text() == first


def test_the_committed_validation_summary_is_the_codes(tmp_path: Path) -> None:
    from plansim.validation.run import compare_saved

    compare_saved(ROOT / "validation" / "cpu", out=tmp_path)
    committed = (ROOT / "validation" / "cpu" / "summary.md").read_text()
    assert (tmp_path / "summary.md").read_text() == committed, (
        "validation/cpu is stale: regenerate it with `plansim validate --from validation/cpu`"
    )


# ---- 2. no output over an input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("given", ["file", "folder", "symlink", "dotted"])
def test_import_refuses_to_write_over_its_config(tmp_path: Path, given: str) -> None:
    folder = tmp_path / "cfg"
    folder.mkdir()
    config = folder / "config.json"
    config.write_text(json.dumps(LLAMA))
    (tmp_path / "link.json").symlink_to(config)
    source = folder if given == "folder" else config
    out = {"symlink": tmp_path / "link.json", "dotted": folder / ".." / "cfg" / "config.json"}.get(given, config)
    before = snapshot(tmp_path)
    one_line_error(cli("import", source, "--out", out), "--out", "is the input file")
    assert snapshot(tmp_path) == before


def test_plan_refuses_an_out_folder_holding_an_input_it_would_replace(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "winner.yaml").write_text(TINY)  # plan writes winner.yaml into --out
    before = snapshot(tmp_path)
    result = cli("plan", "-m", out / "winner.yaml", "-g", "8", "-B", "8", "--no-des", "--out", out)
    one_line_error(result, "would write over the input file", "winner.yaml")
    assert snapshot(tmp_path) == before  # nothing written: the refusal comes before the first file moves


def test_a_trace_over_the_model_file_is_refused_before_the_run(tmp_path: Path) -> None:
    model = tmp_path / "m.yaml"
    model.write_text(TINY)
    result = cli("simulate", "-m", model, "-s", "dp=2", "-e", "des", "--trace", model)
    one_line_error(result, "--trace", "is the input file")
    assert model.read_text() == TINY


def test_an_output_replaces_no_file_the_command_read(tmp_path: Path) -> None:
    from plansim.files.outputs import atomic_write_text
    from plansim.files.yamlfile import read_text, recording_inputs

    path = tmp_path / "a.yaml"
    path.write_text("a: 1\n")
    with recording_inputs():
        read_text(path, "model")
        raises_one_line(lambda: atomic_write_text(path, "b: 2\n"), "would write over the input file")
        atomic_write_text(tmp_path / "other.yaml", "c: 3\n")  # any other file is written
    assert path.read_text() == "a: 1\n"
    atomic_write_text(path, "b: 2\n")  # outside a command nothing is recorded: the API writes where it is told
    assert path.read_text() == "b: 2\n"


# ---- 3. FIFOs, devices, sockets, folders, symlink loops -------------------------------------------------------------


def _special(tmp_path: Path, kind: str, name: str) -> Path:
    path = tmp_path / name
    if kind == "a FIFO":
        os.mkfifo(path)
    elif kind == "a folder":
        path.mkdir()
    elif kind == "a symlink loop":
        path.symlink_to(path.name)
    elif kind == "a socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif kind == "a device":
        return Path(os.devnull)
    return path


def _loaders() -> dict[str, tuple[Callable[[Path], Any], str]]:
    from plansim.hardware import load_hardware
    from plansim.remat.api import load_graph_file
    from plansim.strategy.schema import load_strategy
    from plansim.sweep.grid import load_grid
    from plansim.workload import load_model
    from plansim.workload.hf_config import read_hf_config

    return {
        "model": (load_model, "m.yaml"),
        "hardware": (load_hardware, "node.yaml"),
        "strategy": (load_strategy, "s.yaml"),
        "grid": (load_grid, "grid.yaml"),
        "graph": (load_graph_file, "g.json"),
        "config": (read_hf_config, "config.json"),
    }


KINDS = ["a FIFO", "a folder", "a symlink loop", "a socket", "a device"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("loader", sorted(_loaders()))
def test_special_files_are_refused_without_a_blocking_read(tmp_path: Path, loader: str, kind: str) -> None:
    load, name = _loaders()[loader]
    if kind == "a folder" and loader in ("model", "config"):
        pytest.skip("a folder names a Hugging Face model's directory there (its config.json is looked for)")
    path = _special(tmp_path, kind, name)
    raises_one_line(lambda: load(path), f"is {kind}, not a regular file")


@pytest.mark.parametrize(
    "args",
    [
        ("simulate", "-m", "{f}", "-s", "dp=8"),
        ("simulate", "-m", "gpt3-125m", "-H", "{f}", "-s", "dp=8"),
        ("plan", "-m", "{f}", "-B", "16"),
        ("import", "{f}"),
        ("sweep", "--grid", "{f}", "--out", "{out}"),
        ("remat", "--graph", "{f}", "-b", "1GB"),
    ],
    ids=["simulate-model", "simulate-hardware", "plan", "import", "sweep-grid", "remat-graph"],
)
def test_a_fifo_on_the_command_line_is_one_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    line = one_line_error(cli(*(a.format(f=fifo, out=tmp_path / "o") for a in args)), "is a FIFO")
    assert "not found" not in line


def test_validate_from_a_folder_whose_measurements_are_a_fifo(tmp_path: Path) -> None:
    shutil.copy(ROOT / "validation" / "cpu" / "environment.json", tmp_path)
    os.mkfifo(tmp_path / "measured.csv")
    one_line_error(cli("validate", "--from", tmp_path), "measured.csv", "is a FIFO")


# ---- 4. --out names the file system refuses -------------------------------------------------------------------------

LONG = "x" * 300


@pytest.mark.parametrize(
    "args",
    [
        ("plan", "-m", "gpt3-125m", "-B", "16", "--no-des", "--out", "{long}"),
        ("compare", "-m", "gpt3-125m", "-s", "dp=8", "-e", "analytic", "--out", "sub/{long}"),
        ("sweep", "-m", "gpt3-125m", "-g", "8", "-B", "16", "--out", "{long}"),
        ("remat", "-m", "gpt3-125m", "-k", "1", "--granularity", "layer", "-b", "1GB", "--out", "{long}"),
        ("import", str(ROOT / "tests" / "data" / "hf" / "gpt2.json"), "--out", "{long}.yaml"),
        ("simulate", "-m", "gpt3-125m", "-s", "dp=8", "-e", "des", "--trace", "{long}.json"),
        ("profile", "--out", "{long}.yaml"),
        ("validate", "--from", str(ROOT / "validation" / "cpu"), "--out", "{long}"),
    ],
    ids=["plan", "compare", "sweep", "remat", "import", "trace", "profile", "validate"],
)
def test_an_out_name_over_255_bytes_is_one_line_before_the_work(tmp_path: Path, args: tuple[str, ...]) -> None:
    with contextlib.chdir(tmp_path):
        before = snapshot(ROOT / "validation" / "cpu")
        line = one_line_error(cli(*(a.format(long=LONG) for a in args)), "a name of 30", "longer than the 255")
        assert snapshot(ROOT / "validation" / "cpu") == before
        assert list(tmp_path.iterdir()) == [], line


# ---- 5. Dask scheduler addresses -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("", ("empty address",)),
        ("   ", ("empty address",)),
        ("not an address", ("not a Dask scheduler address",)),
        ("tcp://host", ("not a Dask scheduler address",)),
        ("tcp://host:99999", ("not a Dask scheduler address",)),
        ("xyz://host:1", ("unknown protocol 'xyz'",)),
        (3, ("expected an address",)),
    ],
)
def test_a_bad_scheduler_address_is_refused_before_connecting(address: Any, words: tuple[str, ...]) -> None:
    from plansim.sweep.executors import check_scheduler

    raises_one_line(lambda: check_scheduler(address), *words)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("scheme", ["tcp", "tls"])
def test_a_failed_connection_fails_fast_and_leaves_nothing_for_exit(scheme: str) -> None:
    """tls without certificates raised a TypeError; a failed client's __del__ waited twice the timeout, then printed a
    TimeoutError traceback (an 'unraisable' exception, seen here through sys.unraisablehook)."""
    distributed = pytest.importorskip("distributed")
    from plansim.sweep.executors import _client

    unraisable: list[Any] = []
    previous = sys.unraisablehook
    sys.unraisablehook = unraisable.append
    try:
        raises_one_line(
            lambda: _client(distributed, f"{scheme}://127.0.0.1:{_closed_port()}", 0.5), "cannot reach a Dask scheduler"
        )
        with no_hang(5):
            gc.collect()
    finally:
        sys.unraisablehook = previous
    assert unraisable == []


def test_sweep_checks_the_address_before_any_point_runs() -> None:
    from plansim.sweep import SweepGrid, sweep

    grid = SweepGrid(("gpt3-125m",), ("dgx-a100",), (8,), (16,))
    raises_one_line(lambda: sweep(grid, scheduler="not an address"), "not a Dask scheduler address")
    raises_one_line(lambda: sweep(grid, scheduler=3.5), "distributed.Client")


# ---- 6-8. work and memory bounds that count cost --------------------------------------------------------------------


def _deep(layers: int) -> Any:
    from plansim.workload import ModelSpec

    return ModelSpec(name=f"deep{layers}", family="gpt", layers=layers, hidden=256, heads=4, ffn_hidden=1024,
                     seq_len=128, vocab=1000)  # fmt: skip


def test_search_work_counts_what_the_enumeration_walks() -> None:
    """Brute force over the enumerated strategies: each candidate's busiest stage, the interleaved orders once per
    (pp, micro-batches, chunks)."""
    from plansim.hardware import load_hardware
    from plansim.pipeline.schedules import SCHEDULES
    from plansim.planner.space import INTERLEAVED_PER_BLOCK, candidates, search_work

    for model, gpus, batch in ((_deep(24), 8, 64), (plansim.load_model("gpt3-125m"), 16, 32)):
        cluster = load_hardware("dgx-a100", gpus=gpus)
        space = list(candidates(model, cluster, batch))
        orders = {(s.pp, batch // (s.dp * s.micro_batch), s.virtual_stages) for s in space
                  if SCHEDULES[s.schedule].model_chunks}  # fmt: skip
        interleaved = sum(pp * m * v * v for pp, m, v in orders)
        blocks = sum(math.ceil(model.layers / s.pp) for s in space) + math.ceil(interleaved / INTERLEAVED_PER_BLOCK)
        work = search_work(model, cluster, batch)
        assert (work.candidates, work.block_walks) == (len(space), blocks)


def test_a_plan_of_10000_blocks_is_refused_at_once_naming_the_variable() -> None:
    """6,123 candidates on 8 GPUs at batch 16, priced at 0.3-1.5 s each before the bound counted blocks."""
    model = _deep(10_000)
    raises_one_line(lambda: plansim.plan(model, "dgx-a100", gpus=8, global_batch=16, des=False),
                    "blocks walked", "PLANSIM_MAX_PLAN_BLOCKS=", "--pp")  # fmt: skip


def test_the_plan_blocks_bound_is_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from plansim.hardware import load_hardware
    from plansim.planner.space import search_work

    model = _deep(4)
    blocks = search_work(model, load_hardware("dgx-a100", gpus=8), 16).block_walks
    monkeypatch.setenv("PLANSIM_MAX_PLAN_BLOCKS", str(blocks - 1))
    raises_one_line(lambda: plansim.plan(model, "dgx-a100", gpus=8, global_batch=16, des=False, milp=False),
                    f"about {blocks:,} blocks walked")  # fmt: skip
    monkeypatch.setenv("PLANSIM_MAX_PLAN_BLOCKS", str(blocks))
    assert plansim.plan(model, "dgx-a100", gpus=8, global_batch=16, des=False, milp=False).winner is not None


def test_a_plan_on_2_to_the_20_gpus_stays_within_the_documented_memory() -> None:
    """It peaked at 6.6 GB resident building the power-of-two collectives' schedules over 2^20 ranks; the planner
    now searches only what NCCL runs, priced in closed form. Its peak resident memory, measured in a child process
    (getrusage), must stay within docs/limits.md's 1-2 GB."""
    code = (
        "import resource, plansim\n"
        "r = plansim.plan('gpt3-125m', 'dgx-h100', gpus=2**20, global_batch=2**24, des=False, milp=False)\n"
        "assert r.winner is not None\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert int(out.stdout.split()[-1]) * 1024 < 2 * 10**9  # ru_maxrss is in KiB on Linux


def test_hardware_links_on_2_to_the_20_gpus_is_refused_at_once() -> None:
    one_line_error(cli("hardware", "--links", "-H", "dgx-h100", "-g", "1048576"), "5,441,537", "PLANSIM_MAX_TOPOLOGY")


@pytest.mark.parametrize("node", sorted(p.stem for p in (ROOT / "hardware_profiles" / "nodes").glob("*.yaml")))
def test_topology_size_is_the_graphs(node: str) -> None:
    from plansim.hardware import load_node
    from plansim.hardware.topology import build_topology, topology_size

    spec = load_node(node)
    for gpus in (1, 3, spec.gpus_per_node, 3 * spec.gpus_per_node + 1, 1000):
        if gpus > spec.gpus_per_node and gpus % spec.gpus_per_node and gpus != 3 * spec.gpus_per_node + 1:
            continue
        graph = build_topology(spec, gpus)
        assert topology_size(spec, gpus) == graph.number_of_nodes() + graph.number_of_edges(), (node, gpus)


def test_a_million_point_sweep_is_refused_before_loading_a_point() -> None:
    from plansim.sweep import SweepGrid, sweep

    grid = SweepGrid(("gpt3-125m",), ("dgx-a100",), tuple(range(8, 8001, 8)), tuple(range(1, 1001)))
    raises_one_line(lambda: sweep(grid), "1,000,000 grid points", "PLANSIM_MAX_SWEEP_POINTS")


def test_the_sweep_blocks_bound_sums_the_points_searches(monkeypatch: pytest.MonkeyPatch) -> None:
    from plansim.hardware import load_hardware
    from plansim.planner.space import search_work
    from plansim.sweep import SweepGrid, sweep

    grid = SweepGrid(("gpt3-125m",), ("dgx-a100",), (8, 16), (16,))
    spec = plansim.load_model("gpt3-125m")
    total = sum(search_work(spec, load_hardware("dgx-a100", gpus=g), 16).block_walks for g in (8, 16))
    monkeypatch.setenv("PLANSIM_MAX_SWEEP_BLOCKS", str(total - 1))
    raises_one_line(lambda: sweep(grid), f"about {total:,} blocks walked", "PLANSIM_MAX_SWEEP_BLOCKS")


def test_the_des_estimate_is_the_lowerings_work() -> None:
    """``des_estimate`` extrapolates from pp and 2 pp micro-batches without lowering the run itself: exact."""
    from plansim.des.lower import lower
    from plansim.des.size import des_estimate, des_work
    from plansim.hardware import load_hardware
    from plansim.strategy.schema import Strategy

    spec, cluster = plansim.load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=8)
    for text in ("dp=2,tp=2,pp=2,micro_batch=1,global_batch=32", "dp=4,pp=2,micro_batch=1,global_batch=64,zero=1",
                 "dp=1,pp=4,tp=2,micro_batch=2,global_batch=32,schedule=interleaved,virtual_stages=3"):  # fmt: skip
        s = Strategy.parse(text).resolve(cluster)
        assert s.num_microbatches > 2 * s.pp
        assert des_estimate(spec, cluster, s) == des_work(lower(spec, cluster, s), cluster, "symmetric")


def test_the_finalists_des_work_is_bounded_naming_the_top_that_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    from plansim.des.size import des_estimate
    from plansim.hardware import load_hardware

    kw = {"gpus": 8, "global_batch": 32, "top_k": 4, "milp": False}
    found = plansim.plan("gpt3-125m", "dgx-a100", des=False, **kw)
    spec, cluster = plansim.load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=8)
    sizes = [des_estimate(spec, cluster, f.priced.strategy.resolve(cluster)) for f in found.outcome.finalists]
    assert len(sizes) == 4 and min(sizes) > 0
    monkeypatch.setenv("PLANSIM_MAX_FINALIST_TASKS", str(sum(sizes) - 1))  # any three fit, not all four
    words = (f"about {sum(sizes):,} tasks and transfers", "use --top 3", "PLANSIM_MAX_FINALIST_TASKS")
    raises_one_line(lambda: plansim.plan("gpt3-125m", "dgx-a100", **kw), *words)
    monkeypatch.setenv("PLANSIM_MAX_FINALIST_TASKS", str(sum(sizes)))
    assert plansim.plan("gpt3-125m", "dgx-a100", **kw).winner_result.engine == "des"


def test_a_memory_error_at_the_cli_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import plansim.api

    def exhausted(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(plansim.api, "simulate", exhausted)
    result = cli("simulate", "-m", "gpt3-125m", "-s", "dp=8")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and "out of memory" in result.stderr


def test_progress_estimates_the_time_left_from_the_rate() -> None:
    from plansim.report.progress import Progress

    lines = __import__("io").StringIO()
    bar = Progress("des", live=False, stream=lines)
    bar.phase("finalists", total=1000)
    bar._phase_began -= 20.0  # 20 s into the phase
    assert bar.remaining_s() is None  # nothing done: no estimate
    bar.update(250)
    left = bar.remaining_s()
    assert left is not None and 59 < left < 61  # a quarter in 20 s: three quarters in 60 s more
    assert "about 60 s left" in bar._line() or "about 61 s left" in bar._line()
    bar.update(1000)
    assert bar.remaining_s() is None


# ---- 9. the Python API ----------------------------------------------------------------------------------------------

NAN = float("nan")
BAD_CALLS: list[tuple[str, Callable[[], Any], tuple[str, ...]]] = [
    ("simulate(link_factors={None: 1})",
     lambda: plansim.simulate("gpt3-125m", "dgx-a100", "dp=8", engine="des", link_factors={None: 1}),
     ("link_factors", "None")),
    ("simulate(link_factors={'': 1})",
     lambda: plansim.simulate("gpt3-125m", "dgx-a100", "dp=8", engine="des", link_factors={"": 1}), ("link's name",)),
    ("from_hf_config(None)", lambda: _from_hf(None), ("source", "None")),
    ("from_hf_config(3)", lambda: _from_hf(3), ("source", "int")),
    ("Strategy(dp=nan)", lambda: plansim.Strategy(dp=NAN), ("Strategy: field 'dp'", "finite")),
    ("Strategy(dp=True)", lambda: plansim.Strategy(dp=True), ("field 'dp'", "boolean True")),
    ("Strategy(dp='8')", lambda: plansim.Strategy(dp="8"), ("field 'dp'", 'string "8"', "without quotes")),
    ("Strategy(zero=True)", lambda: plansim.Strategy(zero=True), ("field 'zero'", "boolean")),
    ("Strategy(layer_split=[True, 1])", lambda: plansim.Strategy(pp=2, layer_split=[True, 1]), ("layer_split",)),
    ("Strategy.parse('dp=true')", lambda: plansim.Strategy.parse("dp=true"), ("field 'dp'", "boolean")),
    ("simulate(strategy={'dp': True})", lambda: plansim.simulate("gpt3-125m", "dgx-a100", {"dp": True}), ("'dp'",)),
    ("simulate(strategy={'tp': '8'})", lambda: plansim.simulate("gpt3-125m", "dgx-a100", {"tp": "8"}), ("'tp'",)),
    ("load_hardware(gpus=8.5)", lambda: plansim.load_hardware("dgx-a100", gpus=8.5), ("whole number",)),
    ("load_hardware(gpus=True)", lambda: plansim.load_hardware("dgx-a100", gpus=True), ("whole number",)),
    ("load_model(a mapping)", lambda: plansim.load_model({"layers": 2}), ()),
]  # fmt: skip


def _from_hf(source: Any) -> Any:
    from plansim.workload.hf_config import from_hf_config

    return from_hf_config(source)


@pytest.mark.parametrize(("call", "words"), [(c, w) for _, c, w in BAD_CALLS], ids=[n for n, _, _ in BAD_CALLS])
def test_a_bad_api_call_is_one_line(call: Callable[[], Any], words: tuple[str, ...]) -> None:
    raises_one_line(call, *words)


@pytest.mark.parametrize("text", ["dp: true\n", 'dp: "8"\n', "tp: '2'\n", "zero: true\n"])
def test_a_strategy_file_does_not_coerce_booleans_or_strings(tmp_path: Path, text: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    field = text.split(":")[0]
    raises_one_line(lambda: plansim.load_strategy(path), f"field '{field}'", "must be a whole number")


def test_an_integral_float_gpu_count_is_taken_everywhere_alike() -> None:
    assert plansim.load_hardware("dgx-a100", gpus=16.0).num_gpus == 16
    assert type(plansim.load_hardware("dgx-a100", gpus=16.0).num_gpus) is int
    as_float = plansim.simulate("gpt3-125m", "dgx-a100", "dp=16", gpus=16.0)
    assert as_float.step_time_s == plansim.simulate("gpt3-125m", "dgx-a100", "dp=16", gpus=16).step_time_s
    for bad in (16.5, NAN):
        raises_one_line(lambda bad=bad: plansim.load_hardware("dgx-a100", gpus=bad))
        raises_one_line(lambda bad=bad: plansim.simulate("gpt3-125m", "dgx-a100", "dp=16", gpus=bad))


# ---- 10. messages ---------------------------------------------------------------------------------------------------


def test_a_long_head_dim_is_echoed_short() -> None:
    message = raises_one_line(lambda: _from_hf({**LLAMA, "head_dim": "9" * 5000}), "head_dim=", "...")
    assert len(message) < 400


@pytest.mark.parametrize(("value", "said"), [("4096", 'the string "4096"'), (True, "true"), (2.5, "2.5")])
def test_a_quoted_number_is_said_to_be_a_string(value: Any, said: str) -> None:
    raises_one_line(lambda: _from_hf({**LLAMA, "hidden_size": value}), "'hidden_size'", f"got {said}")


def test_plan_remat_milp_does_not_say_remat_full() -> None:
    result = cli("plan", "-m", "gpt3-125m", "-g", "8", "-B", "16", "--remat", "milp", "--no-des", "--format", "json")
    assert result.exit_code == 0, result.output
    explanation = json.loads(result.stdout)["explanation"]
    assert "--remat full" not in explanation
    assert "excluded by --remat, which leaves out selective" in explanation


# ---- 11. remat's curve, --version, models ---------------------------------------------------------------------------

REMAT = ("remat", "-m", "gpt3-125m", "-k", "1", "--granularity", "layer", "-b", "1GB", "--format", "json")


def test_remat_curve_points_0_writes_only_the_schedule(tmp_path: Path) -> None:
    from plansim.remat.api import plan_remat, remat_graph, schedule_document

    result = cli(*REMAT, "--out", tmp_path / "r", "--curve-points", "0")
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["schedule.json"]
    graph = remat_graph("gpt3-125m", stage_layers=1, granularity="layer")
    expected = schedule_document(graph, plan_remat(graph, 1e9).milp)
    assert json.loads((tmp_path / "r" / "schedule.json").read_text()) == json.loads(json.dumps(expected))


def test_the_remat_curve_shares_its_time_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import plansim.remat.api as remat_api

    seen: list[tuple[int, float]] = []
    real = remat_api.tradeoff_curve

    def spy(graph: Any, budgets: Any, **kw: Any) -> Any:
        seen.append((len(list(budgets)), kw["time_limit_s"]))
        return real(graph, budgets, **kw)

    monkeypatch.setattr(remat_api, "tradeoff_curve", spy)
    result = cli(*REMAT, "--out", tmp_path / "r", "--curve-points", "4", "--curve-time-limit", "2", "--time-limit", "9")
    assert result.exit_code == 0, result.output
    ((count, each),) = seen
    assert count in (3, 4) and each == pytest.approx(min(9, 2 / count))
    frame = (tmp_path / "r" / "tradeoff.csv").read_text().splitlines()
    assert len(frame) > count  # a header, the curve's budgets (every method) and the --budget's results


def test_remat_help_says_what_each_budget_gets() -> None:
    text = " ".join(cli("remat", "--help").output.split())
    assert "--curve-points" in text and "--curve-time-limit" in text
    assert "budgets gets" not in text and "12 budgets" not in text


def test_version_is_the_package_metadata() -> None:
    result = cli("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"plansim {version('plansim')}"


def test_models_prints_human_counts_and_the_sequence_length() -> None:
    rows = json.loads(cli("models", "--format", "json").stdout)
    assert all(r["seq_len"] == plansim.load_model(r["name"]).seq_len for r in rows)
    assert all(type(r["parameters"]) is int for r in rows)
    table = cli("models").stdout
    gpt = next(r for r in rows if r["name"] == "gpt3-125m")
    assert "seq_len" in table and f"{gpt['parameters'] / 1e6:.1f}M" in table and str(gpt["parameters"]) not in table
