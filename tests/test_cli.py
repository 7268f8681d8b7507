"""The CLI: contract-shaped JSON, and one clear line with exit code 2 for every kind of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from plansim.cli.app import app

runner = CliRunner()
GOOD = ["--model", "gpt3-125m", "--hardware", "dgx-a100", "--gpus", "8"]
STRAT = "dp=8,tp=1,pp=1,micro_batch=1,global_batch=8"


def run(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture()
def files(tmp_path: Path) -> dict[str, Path]:
    out = {
        "broken_yaml": "name: m\nfamily: gpt\nlayers: [1, 2\n",
        "unknown_key": "name: m\nfamily: gpt\nlayers: 2\nhidden: 64\nheads: 4\nseq_len: 16\nvocab: 100\ncolour: 1\n",
        "missing_key": "name: m\nfamily: gpt\nlayers: 2\nheads: 4\nseq_len: 16\nvocab: 100\n",
        "heads_hidden": "name: m\nfamily: gpt\nlayers: 2\nhidden: 64\nheads: 5\nseq_len: 16\nvocab: 100\n",
        "bad_strategy": "tp: [1\n",
    }
    paths = {}
    for name, text in out.items():
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(text)
    return paths


# (label, argv builder, words the message must contain)
BAD_INPUTS = [
    (
        "unknown model",
        lambda f: ["--model", "no-such-model", "--hardware", "dgx-a100", "--strategy", STRAT],
        ["no-such-model", "gpt3-175b"],
    ),
    ("unknown hardware", lambda f: ["--model", "gpt3-125m", "--hardware", "dgx-z9", "--strategy", STRAT], ["dgx-z9"]),
    (
        "malformed model yaml",
        lambda f: ["--model", str(f["broken_yaml"]), "--hardware", "dgx-a100", "--strategy", STRAT],
        ["broken_yaml.yaml"],
    ),
    (
        "unknown model key",
        lambda f: ["--model", str(f["unknown_key"]), "--hardware", "dgx-a100", "--strategy", STRAT],
        ["colour"],
    ),
    (
        "missing model key",
        lambda f: ["--model", str(f["missing_key"]), "--hardware", "dgx-a100", "--strategy", STRAT],
        ["hidden"],
    ),
    (
        "heads do not divide hidden",
        lambda f: ["--model", str(f["heads_hidden"]), "--hardware", "dgx-a100", "--strategy", STRAT],
        ["heads"],
    ),
    ("strategy not key=value", lambda f: [*GOOD, "--strategy", "dp=8,tp"], ["'tp'", "key=value"]),
    ("unknown strategy key", lambda f: [*GOOD, "--strategy", "dp=8,flux=2"], ["flux"]),
    ("strategy value type", lambda f: [*GOOD, "--strategy", "dp=8,tp=two"], ["tp"]),
    ("gpus mismatch", lambda f: [*GOOD, "--strategy", "dp=4,tp=1,pp=1"], ["dp*tp*cp*pp", "--gpus"]),
    ("tp does not divide heads", lambda f: [*GOOD, "--strategy", "dp=1,tp=8,pp=1"], ["heads=12"]),
    (
        "more stages than layers",
        lambda f: ["--model", "gpt3-125m", "--hardware", "dgx-a100", "--gpus", "16", "--strategy", "dp=1,tp=1,pp=16"],
        ["layers"],
    ),
    (
        "global batch not a multiple",
        lambda f: [*GOOD, "--strategy", "dp=8,micro_batch=3,global_batch=100"],
        ["global_batch"],
    ),
    ("zero-3 with pipeline", lambda f: [*GOOD, "--strategy", "dp=4,pp=2,zero=3"], ["zero=3", "pp"]),
    (
        "butterfly on 6 ranks",
        lambda f: [
            "--model",
            "gpt3-125m",
            "--hardware",
            "dgx-a100",
            "--gpus",
            "6",
            "--strategy",
            "dp=6,dp_algorithm=butterfly",
        ],
        ["power-of-two"],
    ),
    ("interleaved without pipeline", lambda f: [*GOOD, "--strategy", "dp=8,schedule=interleaved"], ["pp > 1"]),
    (
        "interleaving one chunk",
        lambda f: [*GOOD, "--strategy", "dp=4,pp=2,schedule=interleaved,global_batch=8"],
        ["virtual_stages >= 2"],
    ),
    (
        "virtual stages without interleaving",
        lambda f: [*GOOD, "--strategy", "dp=4,pp=2,virtual_stages=2"],
        ["virtual_stages"],
    ),
    (
        "gpus not a node multiple",
        lambda f: ["--model", "gpt3-125m", "--hardware", "dgx-a100", "--gpus", "12", "--strategy", "dp=12"],
        ["12"],
    ),
    (
        "bf16 on V100",
        lambda f: ["--model", "gpt3-125m", "--hardware", "dgx-1", "--gpus", "8", "--strategy", "dp=8,dtype=bf16"],
        ["bf16"],
    ),
    ("unknown engine", lambda f: [*GOOD, "--strategy", STRAT, "--engine", "quantum"], ["quantum"]),
    ("missing strategy file", lambda f: [*GOOD, "--strategy", "nosuchstrategy"], ["nosuchstrategy"]),
    ("malformed strategy yaml", lambda f: [*GOOD, "--strategy", str(f["bad_strategy"])], ["bad_strategy.yaml"]),
    ("zero out of range", lambda f: [*GOOD, "--strategy", "dp=8,zero=5"], ["zero"]),
    (
        "tp across nodes",
        lambda f: ["--model", "gpt3-125m", "--hardware", "dgx-a100", "--gpus", "16", "--strategy", "dp=1,tp=16"],
        ["tp=16"],
    ),
    (
        "zero gpus",
        lambda f: ["--model", "gpt3-125m", "--hardware", "dgx-a100", "--gpus", "0", "--strategy", "tp=1"],
        ["gpus"],
    ),
    (
        "missing model file",
        lambda f: ["--model", "nothere/model.yaml", "--hardware", "dgx-a100", "--strategy", STRAT],
        ["nothere/model.yaml"],
    ),
]


@pytest.mark.parametrize("label,argv,words", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_input_is_one_clear_line_and_exit_2(label, argv, words, files) -> None:
    result = runner.invoke(app, ["simulate", *argv(files)])
    assert result.exit_code == 2, (label, result.output)
    assert "Traceback" not in result.output
    err = result.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    for w in words:
        assert w in err, (w, err)


def test_bad_inputs_have_distinct_messages(files) -> None:
    messages = {runner.invoke(app, ["simulate", *argv(files)]).stderr for _, argv, _ in BAD_INPUTS}
    assert len(messages) == len(BAD_INPUTS) >= 15


def test_json_output_is_the_contract() -> None:
    result = run("simulate", *GOOD, "--strategy", STRAT, "--format", "json")
    assert result.exit_code == 0, result.output
    r = json.loads(result.stdout)
    for key in (
        "model",
        "hardware",
        "gpus",
        "strategy",
        "engine",
        "step_time_s",
        "tokens_per_s",
        "model_flops_per_step",
        "hardware_flops_per_step",
        "model_tflops_per_gpu",
        "hardware_tflops_per_gpu",
        "mfu",
        "hfu",
        "fits",
        "peak_memory_bytes",
    ):
        assert key in r
    assert set(r["memory_breakdown_bytes"]) >= {"weights", "gradients", "optimizer", "activations", "workspace"}
    assert set(r["comm_bytes_per_gpu"]) >= {"dp", "tp", "pp", "zero"}
    assert set(r["time_breakdown_s"]) >= {"compute", "recompute", "exposed_comm", "bubble", "optimizer"}
    assert r["gpus"] == 8 and r["engine"] == "analytic"


def test_does_not_fit_is_a_result_not_an_error() -> None:
    result = run(
        "simulate",
        "--model",
        "gpt3-175b",
        "--hardware",
        "dgx-a100",
        "--gpus",
        "8",
        "--strategy",
        "dp=8,micro_batch=1,global_batch=8",
        "--format",
        "json",
    )
    assert result.exit_code == 0, result.output
    r = json.loads(result.stdout)
    assert r["fits"] is False and "GB" in r["reason"]


def test_table_and_csv_formats() -> None:
    table = run("simulate", *GOOD, "--strategy", STRAT)
    assert table.exit_code == 0 and "step time" in table.stdout
    csv = run("simulate", *GOOD, "--strategy", STRAT, "--format", "csv")
    assert csv.exit_code == 0 and csv.stdout.splitlines()[0].startswith("model,")


def test_listings() -> None:
    assert "gpt3-175b" in run("models").stdout
    assert "dgx-a100" in run("hardware").stdout


SCRIPT = Path(sys.executable).parent / "plansim"


@pytest.mark.skipif(not SCRIPT.exists(), reason="plansim script not installed beside this interpreter")
def test_installed_script_reports_without_traceback() -> None:
    p = subprocess.run(
        [str(SCRIPT), "simulate", "--model", "nope", "--hardware", "dgx-a100", "--strategy", STRAT],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr + p.stdout


def test_help_does_not_import_heavy_libraries() -> None:
    code = (
        "import sys; from plansim.cli.app import app; "
        "print(sorted(m for m in ('pandas', 'matplotlib', 'pulp', 'torch', 'networkx') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_des_engine_json_and_trace(tmp_path: Path) -> None:
    trace = tmp_path / "out" / "trace.json"
    r = run(
        "simulate",
        *GOOD,
        "--strategy",
        "dp=2,tp=2,pp=2,micro_batch=1,global_batch=8",
        "--engine",
        "des",
        "--format",
        "json",
        "--trace",
        str(trace),
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["engine"] == "des" and data["stage_time_breakdown_s"]
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["ph"] for e in events} >= {"X", "C", "M"}
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == {"gpu0 (stage 0)", "gpu4 (stage 1)"}


def test_des_table_shows_stages_and_links() -> None:
    r = run("simulate", *GOOD, "--strategy", "dp=2,tp=2,pp=2,micro_batch=1,global_batch=8", "--engine", "des")
    assert r.exit_code == 0, r.output
    assert "per stage" in r.stdout and "busiest links" in r.stdout


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--straggler", "x"], "--straggler 'x': expected RANK=FACTOR"),
        (["--degrade-link", "node0/nic0"], "expected LINK=FACTOR"),
        (["--straggler", "99=1.5"], "straggler rank 99"),
        (["--fail-link", "nowhere"], "nowhere"),
        (["--mode", "sideways"], "mode 'sideways'"),
        (["--straggler", "0=inf"], "finite"),
        (["--jitter", "0.1", "--seed", "-5"], "--seed -5: at least 0"),
        (["--trace", "/"], "--trace /: is a folder"),  # checked before the run
    ],
)
def test_des_bad_what_ifs_exit_2(extra: list[str], words: str) -> None:
    r = run("simulate", *GOOD, "--strategy", STRAT, "--engine", "des", *extra)
    assert r.exit_code == 2
    assert words in r.output and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_what_ifs_without_des_exit_2() -> None:
    for extra in (["--trace", "t.json"], ["--jitter", "0.1"]):
        r = run("simulate", *GOOD, "--strategy", STRAT, *extra)
        assert r.exit_code == 2 and "des" in r.output
