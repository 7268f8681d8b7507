"""Outputs (issue 17): every file written whole (an interrupted ``plan --out`` leaves the previous files or none, no
temporary file behind), ``--out`` problems in one line, ``--format json`` stdout only JSON while HiGHS solves, and
the same input giving byte-identical files. Commands that must run as a user runs them (signals, C-level output,
fresh solver state) run in subprocesses."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from plansim.cli.app import app
from plansim.errors import PlansimError, shown_path
from plansim.files import outputs
from plansim.files.outputs import LOCK_NAME, atomic_write_text, c_stdout_silenced, staged_folder

runner = CliRunner()
CLI = [sys.executable, "-m", "plansim.cli.app"]


def hidden(folder: Path) -> list[str]:
    """Entries of ``folder`` that are temporary files, staging folders or a lock."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# --------------------------------------------------------------------------------------------------------------------
# the helpers
# --------------------------------------------------------------------------------------------------------------------


def test_atomic_write_keeps_the_previous_file_when_the_writer_fails(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    atomic_write_text(path, '{"v": 1}')
    with pytest.raises(RuntimeError), outputs.atomic_path(path) as tmp:
        tmp.write_text('{"v": 2, "cut')
        raise RuntimeError("interrupted")
    assert json.loads(path.read_text()) == {"v": 1} and hidden(tmp_path) == []
    atomic_write_text(path, '{"v": 3}')
    assert json.loads(path.read_text()) == {"v": 3} and hidden(tmp_path) == []


def test_staged_folder_is_all_or_nothing(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with staged_folder(out) as stage:
        for name in ("a.csv", "b.csv"):
            (stage.path / name).write_text("old\n")
        assert list(out.iterdir()) == [stage.path]  # nothing in place before the block ends
    with pytest.raises(KeyboardInterrupt), staged_folder(out) as stage:
        (stage.path / "a.csv").write_text("new\n")
        (stage.path / "c.csv").write_text("new\n")
        raise KeyboardInterrupt
    assert {p.name: p.read_text() for p in out.iterdir()} == {"a.csv": "old\n", "b.csv": "old\n"}


def test_a_write_error_is_one_line_naming_the_option(tmp_path: Path) -> None:
    with pytest.raises(PlansimError) as err, staged_folder(tmp_path, option="--out") as stage:
        raise OSError(28, "No space left on device", str(stage.path / "a.csv"))
    assert str(err.value).startswith(f"--out {shown_path(tmp_path)}: cannot write there (No space left on device)")
    assert "\n" not in str(err.value) and hidden(tmp_path) == []


def test_a_second_writer_waits_for_the_first(tmp_path: Path) -> None:
    released = []

    def hold() -> None:
        with outputs._folder_lock(tmp_path, "--out"):
            held.set()
            time.sleep(0.4)
            released.append(time.monotonic())

    held = threading.Event()
    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(5)
    with staged_folder(tmp_path) as stage:
        (stage.path / "a.csv").write_text("x\n")
    moved = time.monotonic()
    holder.join()
    assert released and moved >= released[0]  # the files moved only once the other writer was done
    assert (tmp_path / "a.csv").read_text() == "x\n" and hidden(tmp_path) == []


def test_a_writer_gives_up_after_the_wait_naming_the_holder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(outputs, "LOCK_WAIT_S", 0.2)
    with outputs._folder_lock(tmp_path, "--out"), pytest.raises(PlansimError) as err, staged_folder(tmp_path) as st:
        (st.path / "a.csv").write_text("x\n")
    message = str(err.value)
    assert message.startswith(
        f"--out {shown_path(tmp_path)}: another plansim (pid {os.getpid()}) is still writing there"
    )
    assert "wait for it to finish" in message and "\n" not in message
    assert not (tmp_path / "a.csv").exists() and hidden(tmp_path) == []


def test_a_lock_left_by_a_killed_run_is_not_in_the_way(tmp_path: Path) -> None:
    (tmp_path / LOCK_NAME).write_text("999999999\n")  # no process holds it
    with staged_folder(tmp_path) as stage:
        (stage.path / "a.csv").write_text("x\n")
    assert (tmp_path / "a.csv").exists() and hidden(tmp_path) == []


def test_c_level_stdout_is_silenced_only_inside_the_block() -> None:
    code = (
        "import ctypes, os\n"
        "from plansim.files.outputs import c_stdout_silenced\n"
        "libc = ctypes.CDLL(None)\n"
        "print('before', flush=True)\n"
        "with c_stdout_silenced():\n"
        "    libc.printf(b'C banner\\n')\n"  # buffered by C stdio: stdout is a pipe here
        "    os.write(1, b'fd banner\\n')\n"
        "print('after')\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "before\nafter\n"


def test_silencing_nests() -> None:
    with c_stdout_silenced(), c_stdout_silenced():
        pass
    assert outputs._silence_depth == 0 and outputs._saved_stdout_fd is None


# --------------------------------------------------------------------------------------------------------------------
# --out problems: one line, exit 2, before any work
# --------------------------------------------------------------------------------------------------------------------

COMMANDS = {
    "plan": ["plan", "--model", "gpt3-125m", "--gpus", "8", "--global-batch", "16", "--remat", "none", "--no-des"],
    "compare": ["compare", "--model", "gpt3-125m", "-s", "dp=8,micro_batch=1,global_batch=16", "--engine", "analytic"],
    "sweep": ["sweep", "--model", "gpt3-125m", "--gpus", "8", "--global-batch", "16"],
    "remat": ["remat", "--model", "gpt3-125m", "--stage-layers", "2", "--granularity", "layer", "--budget", "1GB"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_out_problems_are_one_line(command: str, where: str, tmp_path: Path, monkeypatch) -> None:
    import plansim.comparison.compare
    import plansim.planner
    import plansim.remat.api
    import plansim.sweep

    def no_work(*a: object, **k: object) -> None:
        raise AssertionError("--out must be checked before any work")

    for module, name in ((plansim.planner, "plan"), (plansim.sweep, "sweep"), (plansim.comparison.compare, "compare"),
                         (plansim.remat.api, "plan_remat")):  # fmt: skip
        monkeypatch.setattr(module, name, no_work)
    (tmp_path / "taken").write_text("a file")
    out = tmp_path / "taken" if where == "a file" else tmp_path / "taken" / "sub"
    r = runner.invoke(app, [*COMMANDS[command], "--out", str(out)])
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert err.startswith(f"error: --out {shown_path(out)}: ") and "\n" not in err and "Traceback" not in r.output, err
    assert ("is a file, not a folder" if where == "a file" else "no folder can be made under it") in err
    assert (tmp_path / "taken").read_text() == "a file"


def test_out_in_a_read_only_folder_is_one_line(tmp_path: Path, monkeypatch) -> None:
    if not hasattr(os, "geteuid") or os.geteuid() == 0:  # root writes anywhere: make the folder look read-only
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == tmp_path else real(p, mode))
    tmp_path.chmod(0o555)
    try:
        r = runner.invoke(app, [*COMMANDS["plan"], "--out", str(tmp_path / "run")])
    finally:
        tmp_path.chmod(0o755)
    err = r.stderr.strip()
    assert r.exit_code == 2 and "is not writable: choose a folder you can write to" in err and "\n" not in err, err


# --------------------------------------------------------------------------------------------------------------------
# --format json while the MILP runs: only JSON on stdout
# --------------------------------------------------------------------------------------------------------------------


def json_stdout(*args: str) -> dict:
    p = subprocess.run([*CLI, *args, "--format", "json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)  # fails on a solver banner before the JSON


def test_remat_json_is_only_json_while_highs_solves() -> None:
    # 80 MB: between full recompute's peak (57 MB) and keeping everything (107 MB) for two flash-attention blocks
    data = json_stdout(*COMMANDS["remat"][:-2], "--budget", "80MB", "--time-limit", "20")
    milp = data["milp"]
    assert milp["solver"] == "highs" and milp["variables"] > 0 and milp["status"] == "optimal"


def test_plan_json_is_only_json_while_highs_solves() -> None:
    # one GPU, micro-batch 64: activations overflow the A100, so remat=milp is solved for the finalists (its schedule
    # fills the memory the stage leaves: --headroom 0 keeps it a finalist)
    data = json_stdout(
        "plan", "--model", "gpt3-125m", "--gpus", "1", "--global-batch", "64", "--micro-batch", "64",
        "--remat", "full,milp", "--no-des", "--top", "3", "--headroom", "0",
    )  # fmt: skip
    assert any("remat=milp" in f["strategy"] for f in data["finalists"]), [f["strategy"] for f in data["finalists"]]


# --------------------------------------------------------------------------------------------------------------------
# the same input, the same bytes
# --------------------------------------------------------------------------------------------------------------------

STRATEGIES = ["-s", "dp=8,micro_batch=1,global_batch=16", "-s", "dp=4,tp=2,micro_batch=1,global_batch=16"]
SIMULATE = ["simulate", "--model", "gpt3-125m", "--hardware", "dgx-a100",
            "-s", "dp=4,tp=2,micro_batch=1,global_batch=16"]  # fmt: skip
RUNS = {
    # name: argv, {out} standing for the run's own folder
    "plan": ["plan", "--model", "gpt3-125m", "--gpus", "8", "--global-batch", "16", "--remat", "none,full",
             "--top", "2", "--out", "{out}", "--format", "json"],
    "compare": ["compare", "--model", "gpt3-125m", *STRATEGIES, "--out", "{out}", "--format", "json"],
    "simulate-analytic": [*SIMULATE, "--format", "json"],
    "simulate-des": [*SIMULATE, "--engine", "des", "--trace", "{out}/trace.json", "--format", "json"],
    "remat": [*COMMANDS["remat"][:-2], "--budget", "80MB", "--time-limit", "20", "--curve-points", "3",
              "--out", "{out}", "--format", "json"],
    "sweep": ["sweep", "--model", "gpt3-125m", "--gpus", "8", "--global-batch", "16,32", "--out", "{out}",
              "--format", "json"],
}  # fmt: skip


def _twice(name: str, root: Path) -> list[tuple[Path, bytes]]:
    """RUNS[name] run twice at once in fresh processes, each into its own folder: the two (folder, stdout) pairs.
    (Per command, not a module fixture: under pytest-xdist each worker would run every command again.)"""
    procs = []
    for k in (1, 2):
        out = root / f"{name}-{k}"
        out.mkdir()
        args = [a.replace("{out}", str(out)) for a in RUNS[name]]
        procs.append((out, subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    done = []
    for out, p in procs:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, (name, stderr.decode()[-2000:])
        done.append((out, stdout))
    return done


@pytest.mark.parametrize("name", sorted(RUNS))
def test_the_same_input_gives_byte_identical_files(name: str, tmp_path: Path) -> None:
    (first, out1), (second, out2) = _twice(name, tmp_path)
    files = sorted(p.name for p in first.iterdir())
    assert files == sorted(p.name for p in second.iterdir())
    if name != "simulate-analytic":
        assert files, "the command wrote nothing"
    for f in files:
        assert (first / f).read_bytes() == (second / f).read_bytes(), f"{name}: {f} differs between two runs"
    # stdout too, once the folder's own name (listed under "files") is set aside
    assert out1.replace(str(first).encode(), b"OUT") == out2.replace(str(second).encode(), b"OUT")
    json.loads(out1)


def test_timings_stay_on_the_python_objects() -> None:
    import plansim
    from plansim.planner import Constraints, plan

    r = plansim.simulate("gpt3-125m", "dgx-a100", "dp=2,micro_batch=1,global_batch=4", engine="des")
    assert r.timings["wall_s"] > 0 and "wall_s" not in r.engine_stats and "timings" not in r.to_dict()
    p = plan("gpt3-125m", "dgx-a100", gpus=2, global_batch=4, des=False, constraints=Constraints(remat=("none",)))
    assert set(p.outcome.phase_s) >= {"enumerate", "analytic"}


# --------------------------------------------------------------------------------------------------------------------
# interrupting plan --out at any moment
# --------------------------------------------------------------------------------------------------------------------

PLAN = ["plan", "--model", "gpt3-125m", "--gpus", "8", "--global-batch", "16", "--remat", "none", "--no-des",
        "--top", "2"]  # fmt: skip
PNG_END = b"IEND\xaeB`\x82"


def check_whole(path: Path) -> None:
    """``path`` parses as what its suffix says, to its end."""
    data = path.read_bytes()
    kind = path.suffix
    if kind == ".csv":
        rows = list(csv.reader(io.StringIO(data.decode())))
        assert len(rows) >= 2 and len({len(r) for r in rows}) == 1, f"{path.name}: ragged CSV"
    elif kind == ".json":
        json.loads(data)
    elif kind == ".yaml":
        assert isinstance(yaml.safe_load(data), dict)
    elif kind == ".svg":
        assert data.rstrip().endswith(b"</svg>"), f"{path.name}: cut-off SVG"
    elif kind == ".png":
        assert data.startswith(b"\x89PNG") and data.endswith(PNG_END), f"{path.name}: cut-off PNG"
    else:
        raise AssertionError(f"unexpected file {path.name}")


OLD = {  # a previous run's files, as placeholders: whole, and unlike the new ones
    "results.csv": b"a,b\n1,2\n", "candidates.csv": b"a,b\n1,2\n", "results.json": b'{"old": true}',
    "winner.yaml": b"old: true\n", "time_breakdown.svg": b"<svg>old</svg>\n", "memory.svg": b"<svg>old</svg>\n",
    "time_breakdown.png": b"\x89PNG old" + PNG_END, "memory.png": b"\x89PNG old" + PNG_END,
}  # fmt: skip


def test_interrupting_plan_out_leaves_no_partial_file(tmp_path: Path) -> None:
    """SIGINT and SIGTERM during the search and at several moments of the writing (timed from when the staging
    folder appears), into an empty path and into a folder holding a previous run's files: afterwards the folder
    holds the previous files, or the new ones (each equal to an uninterrupted run's), or, starting empty, none;
    never a mix, never a cut-off file, nothing temporary. The runs go at once, beside the uninterrupted one."""
    reference = tmp_path / "reference"
    ref = subprocess.Popen([*CLI, *PLAN, "--out", str(reference)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # (signal, when): "search" = 0.3 s after start; a number = seconds after the staging folder appeared
    moments: list[str | float] = ["search", 0.0, 0.05, 0.15, 0.4]
    cases = [(sig, when, (k + j) % 2 == 1) for j, sig in enumerate((signal.SIGINT, signal.SIGTERM))
             for k, when in enumerate(moments)]  # fmt: skip
    runs = []
    for k, (sig, when, prefilled) in enumerate(cases):
        out = tmp_path / f"case{k}"
        if prefilled:
            out.mkdir()
            for name, data in OLD.items():
                (out / name).write_bytes(data)
        p = subprocess.Popen([*CLI, *PLAN, "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        runs.append({"out": out, "p": p, "sig": sig, "when": when, "prefilled": prefilled, "start": time.monotonic()})
    deadline = time.monotonic() + 300
    while any(r["p"].poll() is None for r in runs) and time.monotonic() < deadline:
        now = time.monotonic()
        for r in runs:
            if r["p"].poll() is not None or r.get("sent"):
                continue
            if r["when"] == "search":
                fire = now - r["start"] >= 0.3
            else:
                if (
                    "seen" not in r
                    and r["out"].is_dir()
                    and any(n.startswith(".plansim-tmp-") for n in hidden(r["out"]))
                ):
                    r["seen"] = now
                fire = "seen" in r and now - r["seen"] >= float(r["when"])
            if fire:
                r["p"].send_signal(r["sig"])
                r["sent"] = True
        time.sleep(0.002)
    _, err = ref.communicate(timeout=300)
    assert ref.returncode == 0, err.decode()[-2000:]
    new = {p.name: p.read_bytes() for p in reference.iterdir()}
    assert set(new) == set(OLD), sorted(new)
    for r in runs:
        r["p"].wait(timeout=max(1.0, deadline - time.monotonic()))
        out, label = r["out"], (signal.Signals(r["sig"]).name, r["when"], r["prefilled"])
        stderr = r["p"].stderr.read().decode()
        if "seen" in r:  # interrupted while writing (or, at the latest moments, once done): a quiet exit
            quiet = "Traceback" not in stderr or stderr.rstrip().endswith("KeyboardInterrupt")  # at interpreter exit
            assert r["p"].returncode in (0, 1, 130, 143, -2, -15) and quiet, (label, stderr[-2000:])
        if not out.exists():
            assert not r["prefilled"], label
            continue
        assert hidden(out) == [], (label, hidden(out))
        found = {p.name: p.read_bytes() for p in out.iterdir()}
        for name in found:
            check_whole(out / name)
        assert found in (new, OLD) or (found == {} and not r["prefilled"]), (label, sorted(found))
    # the signals sent while the files were being written (the rest: the run had finished before its moment)
    assert sum("seen" in r and r.get("sent", False) for r in runs) >= 4


def test_a_staging_folder_of_a_killed_run_is_removed_by_the_next_run(tmp_path: Path) -> None:
    """A run killed by SIGKILL leaves its hidden staging folder; the next run into the folder removes it once its
    process is gone and it is old enough, and leaves a recent one (a live writer elsewhere may own it)."""
    dead = 2**22 + 12345  # above Linux's largest pid: no such process
    abandoned = tmp_path / f".plansim-tmp-{dead}-abc"
    recent = tmp_path / f".plansim-tmp-{dead}-def"
    legacy = tmp_path / ".plansim-tmp-ghi"  # no pid in the name: not ours to judge
    for folder in (abandoned, recent, legacy):
        folder.mkdir()
        (folder / "results.csv").write_text("half")
    old = time.time() - outputs.ABANDONED_AFTER_S - 1
    os.utime(abandoned, (old, old))
    os.utime(legacy, (old, old))
    with staged_folder(tmp_path) as stage:
        (stage.path / "a.csv").write_text("x\n")
        stage.final([stage.path / "a.csv"])
    assert not abandoned.exists() and recent.exists() and legacy.exists()
    assert (tmp_path / "a.csv").read_text() == "x\n"
