"""The run's sequence length (``seq_len=``, ``--seq-len``, ``seq_len:`` in strategy and grid files): applied once to
the model (``plansim.workload.with_seq_len`` through ``plansim.api.run_model``), so that a run at ``seq_len=N`` is
exactly the run of a model whose own ``seq_len`` is N, in both engines, the planner, compare and sweep; a length
given twice must agree; what cannot take another length (a traced module, a cnn, a learned position table too
short) and a length out of range are one line; ``plansim import`` says which length it took and why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import networkx as nx
import pytest
import typer
import yaml
from typer.testing import CliRunner

import plansim
from plansim.api import run_model
from plansim.cli.app import SEQ_LEN_HELP, app
from plansim.comparison.compare import compare
from plansim.errors import PlansimError, shown_path
from plansim.planner import Constraints, plan
from plansim.planner.output import winner_yaml
from plansim.strategy.schema import Strategy, load_strategy, read_strategy
from plansim.sweep import SweepGrid, grid_from_options, load_grid, sweep
from plansim.workload import ModelSpec, TracedModel, load_model, with_seq_len

runner = CliRunner()
DATA = Path(__file__).parent / "data" / "hf"

#: A small Llama (rotary positions: any length) and its copy at another length, written as a file would give it.
TINY = ModelSpec(
    name="tiny", family="llama", layers=4, hidden=256, heads=8, kv_heads=4, ffn_hidden=512, seq_len=512, vocab=1000
)
AT_1024 = TINY.model_copy(update={"seq_len": 1024})
#: Tensor, pipeline and data parallelism with ZeRO and sequence parallelism: every part of the step sees the length.
STRATEGY = "dp=2,tp=2,pp=2,micro_batch=1,global_batch=8,zero=1,sequence_parallel=true,remat=selective"


def one_line(call: Any, *words: str) -> str:
    """The message of the one-line ``PlansimError`` ``call()`` raises, holding each of ``words``."""
    with pytest.raises(PlansimError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message, message
    assert type(info.value) is PlansimError
    for word in words:
        assert word in message, (word, message)
    return message


def cli_error(*args: str) -> str:
    """The one line a CLI run that must fail prints, with exit code 2 and no traceback."""
    result = runner.invoke(app, list(args))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.fixture()
def tiny_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY.file_fields()))
    return path


# ---- the one place: with_seq_len ---------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_a_step_at_seq_len_is_the_step_of_a_model_of_that_length(engine: str) -> None:
    at = plansim.simulate(TINY, "dgx-a100", STRATEGY, gpus=8, engine=engine, seq_len=1024)
    own = plansim.simulate(AT_1024, "dgx-a100", STRATEGY, gpus=8, engine=engine)
    assert at == own and at.to_dict() == own.to_dict()
    assert at.step_time_s != plansim.simulate(TINY, "dgx-a100", STRATEGY, gpus=8, engine=engine).step_time_s


def test_with_seq_len_copies_the_spec_and_keeps_its_own_length() -> None:
    assert with_seq_len(TINY, 1024) == AT_1024 and TINY.seq_len == 512
    assert with_seq_len(TINY, None) is TINY and with_seq_len(TINY, 512) is TINY
    assert run_model(TINY, 1024) == AT_1024 and run_model("llama2-7b", 8192).seq_len == 8192


def test_a_learned_position_table_sizes_down_and_refuses_longer() -> None:
    """GPT-3's table has seq_len rows (as the builder counts it): a shorter run has the parameters of a model file
    of that length, as ``plansim import --seq-len`` gives; a longer one would be another model, refused."""
    gpt = load_model("gpt3-125m")
    short = with_seq_len(gpt, 1024)
    assert short.num_parameters() == gpt.num_parameters() - 1024 * gpt.hidden
    assert short == ModelSpec.model_validate({**gpt.file_fields(), "seq_len": 1024})
    one_line(lambda: with_seq_len(gpt, 4096), "--seq-len 4096", "learned position table of 2,048 rows", "2048")
    rotary = ModelSpec.model_validate({**gpt.file_fields(), "learned_positions": False})
    assert with_seq_len(rotary, 8192).num_parameters() == rotary.num_parameters()


def test_models_that_cannot_take_another_length_are_one_line() -> None:
    one_line(lambda: with_seq_len(load_model("resnet50"), 1024), "cnn models have no sequence length")
    traced = TracedModel("traced", nx.DiGraph(), layers=2, blocks="h", batch=4, seq_len=128)
    assert with_seq_len(traced, 128) is traced
    one_line(lambda: with_seq_len(traced, 256), "--seq-len 256", "traced module", "128", "trace it again")
    one_line(lambda: run_model(traced, 256), "traced module")
    mlp = load_model("mlp-small")  # samples per sequence: any number
    assert with_seq_len(mlp, mlp.seq_len + 7).seq_len == mlp.seq_len + 7


@pytest.mark.parametrize("value", [0, -1, 2**30, 1.5, "1024", True, float("nan")])
def test_a_bad_length_is_one_line_before_any_work(value: Any) -> None:
    grid = SweepGrid(("gpt3-125m",), ("dgx-a100",), (8,), (8,))
    one_line(lambda: plansim.simulate(TINY, "dgx-a100", "dp=8", seq_len=value), "--seq-len")
    one_line(lambda: plan(TINY, "dgx-a100", gpus=8, global_batch=8, seq_len=value), "--seq-len")
    one_line(lambda: compare(TINY, ["dp=8"], engine="analytic", seq_len=value), "--seq-len")
    one_line(lambda: sweep(grid, seq_len=value), "--seq-len")


# ---- strategy files and text -------------------------------------------------------------------------------------


def test_a_strategy_file_text_or_mapping_gives_the_length(tmp_path: Path) -> None:
    path = tmp_path / "long.yaml"
    path.write_text("dp: 2\ntp: 2\npp: 2\nmicro_batch: 1\nglobal_batch: 8\nzero: 1\nsequence_parallel: true\n"
                    "remat: selective\nseq_len: 1024\n")  # fmt: skip
    own = plansim.simulate(AT_1024, "dgx-a100", STRATEGY, gpus=8)
    assert plansim.simulate(TINY, "dgx-a100", str(path), gpus=8) == own
    assert plansim.simulate(TINY, "dgx-a100", path, gpus=8, seq_len=1024) == own  # given twice, the same: fine
    assert plansim.simulate(TINY, "dgx-a100", STRATEGY + ",seq_len=1024", gpus=8) == own
    mapping = {**read_strategy(STRATEGY).strategy.model_dump(exclude_defaults=True), "seq_len": 1024}
    assert plansim.simulate(TINY, "dgx-a100", mapping, gpus=8) == own
    message = one_line(lambda: plansim.simulate(TINY, "dgx-a100", path, gpus=8, seq_len=2048), "differ")
    shown = shown_path(path)
    assert (
        message == f"--seq-len 2048 and seq_len 1024 in {shown} differ: give the run's length once, or make them agree"
    )


def test_the_strategy_never_holds_the_length() -> None:
    """No engine can read the length from a strategy: it is no field of one, and the readers that return a
    strategy alone refuse it rather than drop it."""
    assert "seq_len" not in Strategy.model_fields
    given = read_strategy("dp=8,seq_len=4096")
    assert given.seq_len == 4096 and given.strategy == Strategy.parse("dp=8")
    one_line(lambda: Strategy.parse("dp=8,seq_len=4096"), "seq_len 4096 is the run's", "not a strategy field")
    one_line(lambda: plansim.simulate(TINY, "dgx-a100", "dp=8,seq_len=0"), "strategy: seq_len 0", "at least 1")


def test_a_bad_length_in_a_strategy_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("dp: 8\nseq_len: many\n")
    one_line(lambda: plansim.simulate(TINY, "dgx-a100", path), f"{shown_path(path)}: seq_len 'many'", "whole number")
    one_line(lambda: load_strategy(path), f"{shown_path(path)}: seq_len 'many'")  # checked wherever it is read
    assert cli_error("simulate", "-m", "gpt3-125m", "-s", str(path)).startswith(
        f"error: {shown_path(path)}: seq_len 'many'"
    )
    path.write_text("dp: 8\nseq_len: 1024\n")
    one_line(lambda: load_strategy(path), f"{shown_path(path)}: seq_len 1024 is the run's", "not a strategy field")


def test_simulate_framework_keeps_the_files_length(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("dp: 8\nmicro_batch: 1\nglobal_batch: 8\nseq_len: 1024\n")
    r = plansim.simulate(TINY, "dgx-a100", path, framework="fsdp")
    assert r == plansim.simulate(AT_1024, "dgx-a100", "dp=8,micro_batch=1,global_batch=8,framework=fsdp")
    one_line(lambda: plansim.simulate(TINY, "dgx-a100", "dp=8", framework="jax"), "framework 'jax' is unknown")


# ---- plan, compare, sweep ----------------------------------------------------------------------------------------

PLAN: dict[str, Any] = {"hardware": "dgx-a100", "gpus": 8, "global_batch": 8, "des": False, "milp": False, "top_k": 3,
        "constraints": Constraints(remat=("none",), dp_algorithms=("nccl",))}  # fmt: skip


def test_plan_at_seq_len_is_the_plan_of_a_model_of_that_length(tmp_path: Path) -> None:
    at = plan(TINY, **PLAN, seq_len=1024, tokens=1e9)
    own = plan(AT_1024, **PLAN, tokens=1e9)
    assert at.winner == own.winner and at.winner_result == own.winner_result and at.training == own.training
    assert at.seq_len == 1024 and own.seq_len is None
    written = winner_yaml(at)
    assert "seq_len: 1024" in written and "seq_len" not in winner_yaml(own)
    path = tmp_path / "winner.yaml"
    path.write_text(written)
    assert plansim.simulate(TINY, "dgx-a100", path, gpus=8) == plansim.simulate(AT_1024, "dgx-a100", own.winner, gpus=8)


def test_compare_at_seq_len_and_its_files_lengths(tmp_path: Path) -> None:
    strategies = ["dp=8,micro_batch=1,global_batch=8", "dp=4,tp=2,micro_batch=1,global_batch=8"]
    at = compare(TINY, strategies, engine="analytic", seq_len=1024, scaling_gpus=[16])
    own = compare(AT_1024, strategies, engine="analytic", scaling_gpus=[16])
    assert [r.result for r in at.runs] == [r.result for r in own.runs]
    assert [p.result for p in at.scaling] == [p.result for p in own.scaling]
    assert at.seq_len == 1024 and own.seq_len is None
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("dp: 8\nmicro_batch: 1\nglobal_batch: 8\nseq_len: 1024\n")
    b.write_text("dp: 8\nmicro_batch: 1\nglobal_batch: 8\nseq_len: 2048\n")
    from_file = compare(TINY, [str(a), strategies[1]], engine="analytic")  # one file gives it: every run at it
    assert [r.result for r in from_file.runs] == [r.result for r in own.runs] and from_file.seq_len == 1024
    one_line(lambda: compare(TINY, [str(a), str(b)], engine="analytic"), f"seq_len 1024 in {a} and seq_len 2048 in {b}")


def test_sweep_at_seq_len_and_over_lengths(tmp_path: Path, tiny_file: Path) -> None:
    grid = SweepGrid((str(tiny_file),), ("dgx-a100",), (8,), (8,))
    at = sweep(grid, seq_len=1024).frame()
    path = tmp_path / "tiny-1024.yaml"
    path.write_text(yaml.safe_dump(AT_1024.file_fields()))
    own = sweep(SweepGrid((str(path),), ("dgx-a100",), (8,), (8,))).frame()
    figures = ["strategy", "step_time_s", "tokens_per_s", "peak_memory_bytes", "candidates"]
    assert at[figures].equals(own[figures]) and list(at["seq_len"]) == list(own["seq_len"]) == [1024]
    over = sweep(SweepGrid((str(tiny_file), "gpt3-125m"), ("dgx-a100",), (8,), (8,), seq_lens=(1024, 4096)))
    frame = over.frame()
    assert list(frame["seq_len"]) == [1024, 4096, 1024, 4096]
    assert frame.loc[0, figures].equals(at.loc[0, figures])
    assert not frame.loc[3, "fits"] and "learned position table" in frame.loc[3, "reason"]  # gpt3-125m at 4096
    assert over.grid.as_dict()["seq_len"] == [1024, 4096]
    assert "2 sequence lengths" in over.grid.describe()
    one_line(lambda: sweep(over.grid, seq_len=1024), "--seq-len 1024 and the grid's seq_len 1024,4096 differ")


def test_a_grid_file_gives_lengths_and_agrees_with_the_option(tmp_path: Path) -> None:
    path = tmp_path / "grid.yaml"
    path.write_text("model: gpt3-125m\ngpus: 8\nglobal_batch: 8\nseq_len: [1024, 2048]\n")
    assert load_grid(path).seq_lens == (1024, 2048)
    assert grid_from_options(None, None, None, None, str(path), "1024,2048").seq_lens == (1024, 2048)
    one_line(lambda: grid_from_options(None, None, None, None, str(path), "512"), "--seq-len 512 and seq_len")
    plain = tmp_path / "plain.yaml"
    plain.write_text("model: gpt3-125m\ngpus: 8\nglobal_batch: 8\n")
    assert load_grid(plain).seq_lens == () and "seq_len" not in load_grid(plain).as_dict()
    assert grid_from_options(None, None, None, None, str(plain), "512").seq_lens == (512,)
    for bad, words in (
        ("[0]", "positive whole"),
        ("[]", "at least one value"),
        ("[x]", "seq_len"),
        ("[4, 4]", "twice"),
    ):
        path.write_text(f"model: gpt3-125m\ngpus: 8\nglobal_batch: 8\nseq_len: {bad}\n")
        one_line(lambda: load_grid(path), path.name, words)
    one_line(lambda: grid_from_options("gpt3-125m", "8", "8", None, None, "1024,0"), "--seq-len 0")
    one_line(lambda: grid_from_options("gpt3-125m", "8", "8", None, None, ","), "--seq-len", "at least one value")


# ---- the command line --------------------------------------------------------------------------------------------


def test_seq_len_on_simulate_plan_compare_and_sweep(tmp_path: Path, tiny_file: Path) -> None:
    model = ["--model", str(tiny_file), "--gpus", "8"]
    sim = runner.invoke(app, ["simulate", *model, "-s", STRATEGY, "--seq-len", "1024", "-f", "json"])
    assert sim.exit_code == 0, sim.output
    assert json.loads(sim.stdout) == plansim.simulate(AT_1024, "dgx-a100", STRATEGY, gpus=8).to_dict()
    planned = runner.invoke(app, ["plan", *model, "-B", "8", "--no-des", "--remat", "none", "--top", "2",
                                  "--seq-len", "1024", "--format", "json"])  # fmt: skip
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.stdout)["seq_len"] == 1024
    compared = runner.invoke(app, ["compare", *model, "-s", "dp=8,micro_batch=1,global_batch=8", "-e", "analytic",
                                   "--seq-len", "1024", "--format", "json"])  # fmt: skip
    assert compared.exit_code == 0, compared.output
    assert json.loads(compared.stdout)["seq_len"] == 1024
    swept = runner.invoke(app, ["sweep", "-m", str(tiny_file), "-g", "8", "-B", "8", "--seq-len", "512,1024",
                                "--format", "json", "--out", str(tmp_path / "sweep")])  # fmt: skip
    assert swept.exit_code == 0, swept.output
    data = json.loads(swept.stdout)
    assert [r["seq_len"] for r in data["rows"]] == [512, 1024] and data["grid"]["seq_len"] == [512, 1024]
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    helps = {
        c: next(p.help for p in commands[c].params if p.name == "seq_len") for c in ("simulate", "plan", "compare")
    }
    assert set(helps.values()) == {SEQ_LEN_HELP} and next(
        p.help for p in commands["sweep"].params if p.name == "seq_len"
    ).startswith(SEQ_LEN_HELP)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["simulate", "-m", "gpt3-125m", "-s", "dp=8", "--seq-len", "0"], ["error: --seq-len 0: at least 1"]),
        (["simulate", "-m", "gpt3-125m", "-s", "dp=8", "--seq-len", "x"], ["--seq-len", "x"]),
        (["simulate", "-m", "gpt3-125m", "-s", "dp=8", "--seq-len", "4096"], ["learned position table"]),
        (["simulate", "-m", "resnet50", "-s", "dp=8", "--seq-len", "4096"], ["cnn models"]),
        (["simulate", "-m", "gpt3-125m", "-s", "dp=8,seq_len=1024", "--seq-len", "512"], ["differ"]),
        (["plan", "-m", "gpt3-125m", "-B", "8", "--seq-len", "99999999999"], ["--seq-len", "16,777,216"]),
        (["compare", "-m", "gpt3-125m", "-s", "dp=8", "--seq-len", "-3"], ["--seq-len -3: at least 1"]),
        (["sweep", "-m", "gpt3-125m", "-g", "8", "-B", "8", "--seq-len", "0", "--out", "/tmp/x"], ["--seq-len 0"]),
    ],
)
def test_bad_lengths_on_the_command_line_are_one_line(args: list[str], words: list[str]) -> None:
    line = cli_error(*args)
    for word in words:
        assert word in line, (word, line)


def test_import_says_which_length_it_took_and_why() -> None:
    default = runner.invoke(app, ["import", str(DATA / "qwen2.5-7b.json")], terminal_width=400)
    assert default.exit_code == 0, default.output
    said = " ".join(default.output.split())
    assert (
        "seq_len 131,072 from max_position_embeddings (the longest context the model supports, not necessarily" in said
    )
    assert "pass --seq-len" in said
    given = runner.invoke(app, ["import", str(DATA / "qwen2.5-7b.json"), "--seq-len", "4096"], terminal_width=400)
    assert "seq_len 4,096 from --seq-len (the config's max_position_embeddings is 131,072)" in " ".join(
        given.output.split()
    )
    gpt2 = runner.invoke(app, ["import", str(DATA / "gpt2.json")], terminal_width=400)
    assert "learned position table" in gpt2.output and "up to 1,024" in " ".join(gpt2.output.split())


def test_a_config_json_is_priced_at_seq_len() -> None:
    """Qwen2.5-7B imports at its 131,072-token context; --seq-len prices it at the length trained."""
    qwen = load_model(str(DATA / "qwen2.5-7b.json"))
    at = plansim.simulate(str(DATA / "qwen2.5-7b.json"), "dgx-a100", "dp=2,tp=4", seq_len=4096)
    assert at == plansim.simulate(with_seq_len(qwen, 4096), "dgx-a100", "dp=2,tp=4")
    assert qwen.seq_len == 131_072 and at.fits and not plansim.simulate(qwen, "dgx-a100", "dp=2,tp=4").fits


def test_the_result_records_the_length_it_was_priced_at() -> None:
    """``Result.seq_len`` is the length the step was priced at, the run's where one is given, in both engines; its
    tokens per second follow from it (global batch x seq_len / step time), and the text report shows it."""
    from plansim.report.text import print_result

    for engine in ("analytic", "des"):
        r = plansim.simulate("gpt3-125m", "dgx-a100", "dp=8,micro_batch=2,global_batch=16", engine=engine, seq_len=1024)
        assert r.seq_len == 1024
        assert r.tokens_per_s == pytest.approx(16 * 1024 / r.step_time_s, rel=1e-12)
    default = plansim.simulate("gpt3-125m", "dgx-a100", "dp=8,micro_batch=2,global_batch=16")
    assert default.seq_len == plansim.load_model("gpt3-125m").seq_len == 2048
    from rich.console import Console

    console = Console(record=True, width=120)
    print_result(r, console)
    text = console.export_text()
    assert "tokens per sequence" in text and "1,024" in text
