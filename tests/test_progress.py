"""Long commands show progress on stderr (issue 17: the README's remat example printed nothing for 6 minutes, a CPU
profile 15 minutes): plain lines where stderr is no terminal, after a few seconds and at each step, never on
stdout, so ``--format json`` stays JSON; a quick command prints nothing."""

from __future__ import annotations

import io
import json
import time

import pytest
from typer.testing import CliRunner

from plansim.cli.app import app
from plansim.report import progress as progress_module
from plansim.report.progress import Progress

runner = CliRunner()


@pytest.fixture(autouse=True)
def shown(monkeypatch: pytest.MonkeyPatch) -> None:
    """Progress on (``conftest.py`` turns it off for the other tests)."""
    monkeypatch.delenv("PLANSIM_PROGRESS", raising=False)


@pytest.fixture
def eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain lines from the first moment, polled often (the defaults wait 2 s)."""
    monkeypatch.setattr(progress_module, "DELAY_S", 0.0)
    monkeypatch.setattr(progress_module, "_POLL_S", 0.01)


def test_plain_lines_name_each_step_and_the_end(eager: None) -> None:
    out = io.StringIO()
    with Progress("work", 3, stream=out, live=False) as p:
        for k, label in enumerate(("first", "second", "third"), start=1):
            p.update(label=label)
            time.sleep(0.25)
            p.update(k)
    lines = out.getvalue().splitlines()
    for k, label in enumerate(("first", "second", "third")):
        assert any(line.startswith(f"work {k}/3: {label} (") for line in lines), lines
    assert lines[-1].startswith("work: done in ")


def test_a_blocking_step_still_shows_time_going_by(eager: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "EVERY_S", 0.05)
    out = io.StringIO()
    with Progress("solve", stream=out, live=False) as p:
        p.update(label="the MILP")
        time.sleep(0.4)  # no update while it "solves": the thread keeps writing
    assert sum("solve: the MILP (" in line for line in out.getvalue().splitlines()) >= 3


def test_quick_work_prints_nothing() -> None:
    out = io.StringIO()
    with Progress("quick", 2, stream=out, live=False) as p:
        p.update(1, label="a")
        p.update(2, label="b")
    assert out.getvalue() == ""


def test_a_terminal_gets_a_bar_that_goes_away(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)  # CI runs get plain lines whatever the stream (next test)
    monkeypatch.setenv("TERM", "xterm")

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    with Progress("work", 2, stream=out) as p:
        assert p.live
        p.update(1, label="halfway")
    assert "work" in out.getvalue()  # drawn, then erased (transient): what stays is cursor control


def test_ci_gets_plain_lines_even_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.setenv("CI", "true")
    assert not Progress("work", 2, stream=Tty()).live
    monkeypatch.delenv("CI")
    monkeypatch.setenv("TERM", "dumb")
    assert not Progress("work", 2, stream=Tty()).live


def test_plan_progress_is_on_stderr_and_json_stays_json(eager: None) -> None:
    argv = ["plan", "--model", "gpt3-1.3b", "--gpus", "16", "--global-batch", "64", "--no-des", "--top", "3",
            "--format", "json"]  # fmt: skip
    res = runner.invoke(app, argv)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["winner"] is not None
    lines = res.stderr.splitlines()
    assert any(line.startswith("plan") and "pricing candidates" in line for line in lines), lines
    assert lines[-1].startswith("plan: done in ")


def test_plan_reports_each_phase_and_counts_the_des_finalists() -> None:
    from plansim.planner import plan

    labels: list[str] = []
    counts: list[tuple[int, int]] = []
    r = plan("gpt3-1.3b", "dgx-a100", gpus=16, global_batch=64, top_k=2, phase=labels.append,
             progress=lambda done, total: counts.append((done, total)))  # fmt: skip
    assert labels[:4] == [
        "balancing the finalists' layer splits", "remat=milp for up to 3 finalists",
        "sizing the 2 finalists' discrete-event runs",
        "re-simulating the 2 finalists and the reference with the DES (counted in tasks and transfers)",
    ]  # fmt: skip
    # the DES phase counts each run's tasks and transfers as their ceiling gives them (des.size.des_ceiling): the two
    # finalists' and the Megatron-style reference's, re-simulated beside them
    from plansim.des.size import des_ceiling
    from plansim.hardware import load_hardware
    from plansim.workload import load_model

    cluster = load_hardware("dgx-a100", gpus=16)
    runs = [f.priced.strategy for f in r.outcome.finalists]
    assert r.outcome.reference is not None and r.outcome.reference.priced.strategy not in runs
    runs.append(r.outcome.reference.priced.strategy)
    sizes = [des_ceiling(load_model("gpt3-1.3b"), cluster, s.resolve(cluster)) for s in runs]
    assert counts[-5:-3] == [(1, 2), (2, 2)]  # the sizing, one finalist at a time
    assert counts[-3][0] in sizes and counts[-1] == (sum(sizes), sum(sizes)) and min(sizes) > 1
    assert r.outcome.reference.des is not None  # re-simulated
    assert counts[-6][0] == counts[-6][1] == r.outcome.candidates


def test_compare_progress_names_each_run(eager: None) -> None:
    argv = ["compare", "--model", "gpt3-1.3b", "-s", "dp=8,micro_batch=2,global_batch=64", "-s",
            "dp=4,tp=2,micro_batch=2,global_batch=64", "--engine", "des", "--format", "json"]  # fmt: skip
    res = runner.invoke(app, argv)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["engine"] == "des"
    assert "dp4 tp2" in res.stderr and "compare" in res.stderr


def test_a_quick_command_leaves_stderr_empty() -> None:
    res = runner.invoke(app, ["compare", "--model", "gpt3-1.3b", "-s", "dp=8,micro_batch=2,global_batch=64",
                              "--engine", "analytic"])  # fmt: skip
    assert res.exit_code == 0 and res.stderr == ""


def test_remat_progress_names_the_solve(eager: None, monkeypatch: pytest.MonkeyPatch) -> None:
    import plansim.remat.api as remat_api

    real = remat_api.plan_remat

    def slow(*args: object, **kwargs: object) -> object:  # a solve long enough for a line (this one is proven fast)
        time.sleep(0.2)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(remat_api, "plan_remat", slow)
    argv = ["remat", "--model", "gpt3-125m", "--stage-layers", "1", "--granularity", "layer", "--budget", "100GB",
            "--time-limit", "5", "--format", "json"]  # fmt: skip
    res = runner.invoke(app, argv)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["feasible"] is True
    assert "remat: the MILP and the baselines at 100GB (" in res.stderr and "time limit 5 s)" in res.stderr


def test_progress_off_in_the_environment_silences_it(eager: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANSIM_PROGRESS", "off")
    out = io.StringIO()
    with Progress("work", stream=out, live=False) as p:
        p.update(label="step")
        time.sleep(0.1)
    assert out.getvalue() == ""
