"""Any bytes in, one line out (issue 17, reading input).

Data files (model, hardware, strategy, grid, profile YAML; config.json; remat graph files) with bad bytes: each case
writes the file, calls the loader and expects a ``PlansimError`` of one line naming the file and what is wrong
(the byte offset, the line, the key, the limit), checked against the bytes the test wrote. Then the values echoed
back in messages (cut short, on one line), inline strategies and ``KEY=VALUE`` options, and the command line's usage
errors (one line on stderr, exit 2, no traceback, ``--help`` unchanged).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from plansim.errors import PlansimError, quoted, shown, shown_path
from plansim.files.yamlfile import MAX_DEPTH, MAX_FILE_BYTES, MAX_VALUES, parse_json, parse_yaml, read_mapping

MODEL = b"name: m\nfamily: gpt\nlayers: 2\nhidden: 64\nheads: 4\nffn_hidden: 256\nseq_len: 128\nvocab: 1000\n"


def one_line(call: Callable[[], Any], *words: str) -> str:
    """The message of the PlansimError ``call`` raises: one line, holding each of ``words``."""
    with pytest.raises(PlansimError) as err:
        call()
    message = str(err.value)
    assert "\n" not in message and "\r" not in message, message
    for word in words:
        assert word in message, (word, message)
    return message


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


# --- the loaders: every kind of data file goes through the one reader -------------------------------------------


def _load_model(p: Path) -> Any:
    from plansim.workload import load_model

    return load_model(p)


def _load_hardware(p: Path) -> Any:
    from plansim.hardware import load_node

    return load_node(p)


def _load_strategy(p: Path) -> Any:
    from plansim.strategy.schema import load_strategy

    return load_strategy(p)


def _load_grid(p: Path) -> Any:
    from plansim.sweep.grid import load_grid

    return load_grid(p)


def _load_profile(p: Path) -> Any:
    from plansim.profiling.schema import load_kernel_profile

    return load_kernel_profile(p)


def _load_graph(p: Path) -> Any:
    from plansim.remat.api import load_graph_file

    return load_graph_file(p)


def _load_hf(p: Path) -> Any:
    from plansim.workload.hf_config import read_hf_config

    return read_hf_config(p)


YAML_LOADERS = {
    "model": _load_model,
    "hardware": _load_hardware,
    "strategy": _load_strategy,
    "grid": _load_grid,
    "profile": _load_profile,
    "graph": _load_graph,
}
JSON_LOADERS = {"config.json": _load_hf, "graph.json": _load_graph}


@pytest.mark.parametrize("kind", sorted(YAML_LOADERS))
def test_non_utf8_yaml_names_the_byte_offset(tmp_path: Path, kind: str) -> None:
    data = b"name: caf\xe9\nlayers: 2\n"  # Latin-1, not UTF-8: the bad byte is 0xe9 at offset 9
    path = write(tmp_path, "latin1.yaml", data)
    one_line(lambda: YAML_LOADERS[kind](path), "latin1.yaml", f"byte {data.index(0xE9)}", "0xe9", "save it as UTF-8")


@pytest.mark.parametrize("kind", sorted(JSON_LOADERS))
def test_non_utf8_json_names_the_byte_offset(tmp_path: Path, kind: str) -> None:
    data = b'{"model_type": "llama", "x": "\xff\xfe"}'
    path = write(tmp_path, "config.json" if kind == "config.json" else "g.json", data)
    one_line(lambda: JSON_LOADERS[kind](path), path.name, f"byte {data.index(0xFF)}", "save it as UTF-8")


def test_a_utf8_byte_order_mark_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, "bom.yaml", b"\xef\xbb\xbf" + MODEL)
    assert _load_model(path).layers == 2


def test_utf16_is_refused_at_byte_0(tmp_path: Path) -> None:
    path = write(tmp_path, "u16.yaml", MODEL.decode().encode("utf-16"))
    one_line(lambda: _load_model(path), "u16.yaml", "byte 0", "save it as UTF-8")


@pytest.mark.parametrize("kind", sorted(YAML_LOADERS))
def test_deep_yaml_flow_nesting_is_refused(tmp_path: Path, kind: str) -> None:
    path = write(tmp_path, "deep.yaml", b"name: " + b"[" * 5000 + b"]" * 5000 + b"\n")
    one_line(lambda: YAML_LOADERS[kind](path), "deep.yaml", "line 1", f"deeper than {MAX_DEPTH} levels")


def test_deep_yaml_block_nesting_names_the_line(tmp_path: Path) -> None:
    text = "".join("  " * i + f"k{i}:\n" for i in range(300)) + "  " * 300 + "v\n"
    path = write(tmp_path, "block.yaml", text.encode())
    # The root mapping is level 1 and k0's value level 2: the key k62 on line 63 opens level 65.
    one_line(lambda: _load_model(path), "block.yaml", "line 64:", f"deeper than {MAX_DEPTH} levels")


def test_nesting_up_to_the_limit_is_read() -> None:
    depth = MAX_DEPTH - 1  # the top mapping, then 62 lists, then the scalar: 64 levels
    value = parse_yaml("a: " + "[" * (depth - 1) + "1" + "]" * (depth - 1), "x.yaml")["a"]
    for _ in range(depth - 1):
        value = value[0]
    assert value == 1
    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "x.json") == parse_json("[" * 64 + "]" * 64, "y.json")


@pytest.mark.parametrize("kind", sorted(JSON_LOADERS))
def test_deep_json_is_refused_with_its_line(tmp_path: Path, kind: str) -> None:
    text = '{"model_type": "llama",\n "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    path = write(tmp_path, "config.json" if kind == "config.json" else "g.json", text.encode())
    one_line(lambda: JSON_LOADERS[kind](path), path.name, "line 2", f"deeper than {MAX_DEPTH} levels")


def test_json_brackets_inside_strings_are_not_nesting() -> None:
    text = '{"a": "' + "[" * 1000 + '", "b": "\\"[[[[", "c": [1]}'
    assert parse_json(text, "x.json")["c"] == [1]


@pytest.mark.parametrize("kind", sorted(YAML_LOADERS))
def test_oversized_yaml_is_refused_before_parsing(tmp_path: Path, kind: str) -> None:
    # Valid YAML, a comment line past the limit: parsing it would take tens of seconds in pure Python.
    path = write(tmp_path, "big.yaml", MODEL + b"#" * MAX_FILE_BYTES + b"\n")
    start = time.perf_counter()
    one_line(lambda: YAML_LOADERS[kind](path), "big.yaml", "larger than 1 MiB")
    assert time.perf_counter() - start < 2


def test_oversized_config_json_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "config.json", b'{"a": "' + b"x" * MAX_FILE_BYTES + b'"}')
    one_line(lambda: _load_hf(path), "config.json", "larger than 1 MiB")


def test_a_file_at_the_limit_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, "m.yaml", MODEL + b"#" * (MAX_FILE_BYTES - len(MODEL) - 1) + b"\n")
    assert path.stat().st_size == MAX_FILE_BYTES
    assert _load_model(path).hidden == 64


def test_a_duplicate_yaml_key_names_key_and_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "dup.yaml", MODEL + b"layers: 4\n")
    line = MODEL.count(b"\n") + 1
    one_line(lambda: _load_model(path), "dup.yaml", f"line {line}", "duplicate key 'layers'", "first at line 3")


def test_a_duplicate_nested_yaml_key_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "hw.yaml", b"name: x\ngpu: a100\nfabric:\n  nic: 1\n  nic: 2\n")
    one_line(lambda: _load_hardware(path), "hw.yaml", "line 5", "duplicate key 'nic'", "first at line 4")


def test_a_duplicate_key_in_a_strategy_file(tmp_path: Path) -> None:
    path = write(tmp_path, "s.yaml", b"dp: 8\ntp: 2\ndp: 4\n")
    one_line(lambda: _load_strategy(path), "s.yaml", "line 3", "duplicate key 'dp'")


def test_yaml_merge_keys_may_be_overridden() -> None:
    data = parse_yaml("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n", "m.yaml")
    assert data["c"] == {"x": 3, "y": 2}


@pytest.mark.parametrize("kind", sorted(JSON_LOADERS))
def test_a_duplicate_json_key_is_refused(tmp_path: Path, kind: str) -> None:
    path = write(tmp_path, "config.json" if kind == "config.json" else "g.json", b'{"a": 1, "b": {"c": 1, "c": 2}}')
    one_line(lambda: JSON_LOADERS[kind](path), path.name, "duplicate key 'c'")


def test_billion_laughs_is_refused_not_expanded(tmp_path: Path) -> None:
    lines = ["a: &a [" + ", ".join(["x"] * 9) + "]"]
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    path = write(tmp_path, "lol.yaml", "\n".join(lines).encode())  # 9**9 = 387 million strings expanded
    start = time.perf_counter()
    one_line(lambda: _load_model(path), "lol.yaml", f"more than {MAX_VALUES:,} values")
    assert time.perf_counter() - start < 2


def test_a_few_aliases_are_read() -> None:
    data = parse_yaml("a: &a [1, 2]\nb: [*a, *a]\n", "x.yaml")
    assert data["b"] == [[1, 2], [1, 2]]


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "loop.yaml", b"name: &a [1, *a]\n")
    one_line(lambda: _load_model(path), "loop.yaml", "line 1", "cycle")


def test_aliases_cannot_nest_past_the_depth_limit(tmp_path: Path) -> None:
    # Each document alone is 41 levels deep; the alias puts a's 41 levels under b's 31.
    path = write(tmp_path, "a.yaml", b"a: &a " + b"[" * 40 + b"]" * 40 + b"\nb: " + b"[" * 30 + b"*a" + b"]" * 30)
    one_line(lambda: _load_model(path), "a.yaml", f"deeper than {MAX_DEPTH} levels")


@pytest.mark.parametrize(
    ("name", "data", "words"),
    [
        ("nul", MODEL + b"x: 1\x00\n", ["not allowed in YAML", f"character {len(MODEL) + 5}"]),
        ("binary", bytes(range(128)) * 4, ["not allowed in YAML"]),
        ("tab", b"name: m\nfamily:\n\tgpt\n", ["line 3", "fix the syntax"]),
        ("python-object", b"name: !!python/object/apply:os.system ['true']\n", ["line 1", "python/object"]),
        ("long-int", b"layers: " + b"9" * 5000 + b"\n", ["line 1", "more than 4300 digits"]),
        ("bad-date", b"name: m\ndate: 2020-13-45\n", ["line 2", "'2020-13-45'", "timestamp"]),
        ("bad-float-tag", b"layers: !!float abc\n", ["line 1", "'abc'", "float"]),
        ("unhashable-key", b"? [a]\n: 1\n", ["line 1", "unhashable"]),
        ("empty", b"", ["the file is empty"]),
        ("a-list", b"- 1\n- 2\n", ["expected a mapping", "[1, 2]"]),
        ("a-scalar", b"hello\n", ["expected a mapping", "hello"]),
    ],
)
def test_garbage_yaml_is_one_line(tmp_path: Path, name: str, data: bytes, words: list[str]) -> None:
    path = write(tmp_path, f"{name}.yaml", data)
    one_line(lambda: _load_model(path), f"{name}.yaml", *words)


@pytest.mark.parametrize(
    ("name", "data", "words"),
    [
        ("nul", b'{"a": "x\x00y"}', ["malformed JSON at line 1"]),
        ("binary", bytes(range(1, 128)), ["malformed JSON"]),
        ("long-int", b'{"a": ' + b"1" * 5000 + b"}", ["5,000 digits", "at most 4300"]),
        ("single-quotes", b"{'a': 1}", ["malformed JSON at line 1 column 2"]),
        ("a-list", b"[1, 2]", ["expected a JSON object", "list"]),
        ("empty", b"", ["malformed JSON"]),
    ],
)
def test_garbage_json_is_one_line(tmp_path: Path, name: str, data: bytes, words: list[str]) -> None:
    path = write(tmp_path, "config.json", data)
    one_line(lambda: _load_hf(path), "config.json", *words)


def test_a_directory_and_a_missing_file(tmp_path: Path) -> None:
    one_line(lambda: read_mapping(tmp_path, "model"), "is a folder, not a regular file")
    one_line(lambda: read_mapping(tmp_path / "none.yaml", "model", "check it"), "none.yaml", "not found: check it")


def test_unusable_names_are_not_found_not_oserrors(tmp_path: Path) -> None:
    from plansim.hardware import load_hardware
    from plansim.strategy.schema import Strategy
    from plansim.workload import load_model

    long = "x" * 5000  # longer than any file name the system allows (ENAMETOOLONG)
    one_line(lambda: Strategy.parse(long), "is not a file")
    one_line(lambda: load_model(long), "unknown model")
    one_line(lambda: load_model(f"{long}.json"), "cannot be read")
    one_line(lambda: load_model(f"a/{long}.yaml"), "cannot be read: File name too long")
    one_line(lambda: load_hardware(long), "unknown hardware")
    one_line(lambda: load_hardware("a\x00b.yaml"), "not found")
    one_line(lambda: read_mapping(Path("a\x00b.yaml"), "model"), "not a valid path")


def test_validate_from_a_folder_with_a_bad_environment(tmp_path: Path) -> None:
    from plansim.validation.run import compare_saved

    (tmp_path / "measured.csv").write_text("label,step_time_s\nx,1\n")
    (tmp_path / "environment.json").write_bytes(b'{"hardware": "dgx-a100", "hardware": "dgx-h100"}')
    one_line(lambda: compare_saved(tmp_path), "environment.json", "duplicate key 'hardware'")
    (tmp_path / "environment.json").write_bytes(b'{"hardware": ["dgx-a100"]}')
    one_line(lambda: compare_saved(tmp_path), "environment.json", "names no hardware")


# --- values echoed back ---------------------------------------------------------------------------------------


def test_shown_cuts_and_escapes() -> None:
    assert shown("x" * 5000) == "x" * 37 + "..."
    assert shown("a\nb\tc\x00") == "a\\nb\\tc\\x00"
    assert len(shown("\n" * 100)) == 40 and "\n" not in shown("\n" * 100)
    assert shown("dp=8") == "dp=8" and quoted("dp") == "'dp'" and quoted(8) == "8"
    assert shown(10**5000) == "(a number of 5,001 digits)"
    nested: list[Any] = [1]
    for _ in range(10_000):
        nested = [nested] * 10  # repr would never end: reprlib stops at two levels
    assert len(shown(nested)) <= 40
    assert shown_path("/a/" + "b" * 200 + "/model.yaml").endswith("/model.yaml")
    assert len(shown_path("/a/" + "b" * 200 + "/model.yaml")) == 80


def test_a_long_unknown_key_is_cut(tmp_path: Path) -> None:
    path = write(tmp_path, "m.yaml", MODEL + b"k" * 1000 + b": 1\n")  # YAML keys stop at 1024 characters
    message = one_line(lambda: _load_model(path), "m.yaml", "unknown key")
    assert "k" * 81 not in message


def test_many_schema_problems_are_summed_up(tmp_path: Path) -> None:
    from plansim.errors import SHOWN_PROBLEMS

    extra = b"".join(f"extra{i}: 1\n".encode() for i in range(50))
    path = write(tmp_path, "m.yaml", MODEL + extra)
    one_line(lambda: _load_model(path), f"and {50 - SHOWN_PROBLEMS} more")


# --- inline strategies and KEY=VALUE options ------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", " ", "\t\n"])
def test_an_empty_strategy_says_what_to_write(text: str) -> None:
    from plansim.strategy.schema import Strategy, list_strategies

    message = one_line(lambda: Strategy.parse(text), "strategy: empty", "dp=8,tp=2")
    assert all(name in message for name in list_strategies()[:4])


def test_an_unknown_strategy_name_says_what_to_write() -> None:
    from plansim.strategy.schema import Strategy

    one_line(lambda: Strategy.parse("megatron"), "'megatron' is not a file", "dp=8,tp=2", "megatron-3d")
    one_line(lambda: Strategy.parse(",,"), "',,' is not a file", "dp=8,tp=2")


@pytest.mark.parametrize(("text", "key"), [("dp=8,dp=4", "dp"), ("dp=8,tp=2, tp =2", "tp"), ("zero=1,zero=1", "zero")])
def test_a_key_given_twice_in_an_inline_strategy(text: str, key: str) -> None:
    from plansim.strategy.schema import Strategy

    one_line(lambda: Strategy.parse(text), f"strategy: '{key}' is given twice", "keep one")


def test_inline_strategy_values_are_echoed_short() -> None:
    from plansim.strategy.schema import Strategy

    message = one_line(lambda: Strategy.parse("dp=8," + "x" * 5000), "is not key=value")
    assert "x" * 40 not in message
    message = one_line(lambda: Strategy.parse("dp=8,dp_algorithm=" + "y" * 5000), "dp_algorithm")
    assert "y" * 40 not in message
    one_line(lambda: Strategy.parse("dp=8,\nbogus"), "'bogus' is not key=value")
    one_line(lambda: Strategy.parse("dp=" + "[" * 200), "strategy: dp", "deeper than 64 levels")


def test_inline_strategy_still_parses() -> None:
    from plansim.strategy.schema import Strategy

    s = Strategy.parse(" dp=8, tp=2 ,pp=1,,zero=1 ")
    assert (s.dp, s.tp, s.pp, s.zero) == (8, 2, 1, 1)


def test_cli_empty_strategy_is_one_line() -> None:
    from typer.testing import CliRunner

    from plansim.cli.app import app

    r = CliRunner().invoke(app, ["simulate", "-m", "gpt3-125m", "-H", "dgx-a100", "-s", ""])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert "strategy: empty" in r.output and "dp=8,tp=2" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize(
    ("option", "values", "words"),
    [
        ("--straggler", ["3=1.5", "3=2"], ["--straggler 3 is given twice", "each RANK once"]),
        ("--straggler", ["3=1.5", "03=2"], ["--straggler 3 is given twice"]),
        ("--degrade-link", ["node0/nic0=0.5", "node0/nic0=0.2"], ["--degrade-link node0/nic0 is given twice"]),
        ("--degrade-link", ["z" * 5000], ["--degrade-link 'zzz", "expected LINK=FACTOR"]),
        ("--straggler", ["x=1\n2"], ["--straggler 'x=1\\n2'", "expected RANK=FACTOR"]),
    ],
)
def test_key_value_options(option: str, values: list[str], words: list[str]) -> None:
    from typer.testing import CliRunner

    from plansim.cli.app import app

    args = ["simulate", "-m", "gpt3-125m", "-H", "dgx-a100", "-s", "dp=8", "-e", "des"]
    for value in values:
        args += [option, value]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert all(word in r.output for word in words), r.output
    assert "z" * 40 not in r.output


# --- usage errors of the command line -------------------------------------------------------------------------

SIM = ["simulate", "-m", "gpt3-125m", "-H", "dgx-a100", "-s", "dp=8"]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            [*SIM, "--gpus", "abc"],
            "plansim simulate: --gpus: 'abc' is not a valid integer: give a whole number, e.g. --gpus 8",
        ),
        ([*SIM, "--gpus=1.5"], "plansim simulate: --gpus: '1.5' is not a valid integer"),
        ([*SIM, "-gzz"], "plansim simulate: --gpus: 'zz' is not a valid integer"),
        ([*SIM, "-g", "8", "-g", "x"], "plansim simulate: --gpus: 'x' is not a valid integer"),
        (
            [*SIM, "--jitter", "abc"],
            "plansim simulate: --jitter: 'abc' is not a valid number: give a number, e.g. --jitter",
        ),
        (["remat", "--time-limit", "x"], "plansim remat: --time-limit: 'x' is not a valid number"),
        (
            ["plan", "--jobs", "two"],
            "plansim plan: --jobs: 'two' is not a valid integer: give a whole number, e.g. --jobs 8",
        ),
        (
            [*SIM, "--format", "xml"],
            "plansim simulate: --format: 'xml' is not a valid choice: choose one of table, json, csv",
        ),
        ([*SIM, "--gpus"], "plansim simulate: --gpus needs a value, e.g. --gpus 8"),
        (["plan", "--format"], "plansim plan: --format needs a value: see 'plansim plan --help'"),
        ([*SIM, "--gpuss", "8"], "plansim simulate: no such option --gpuss: did you mean --gpus?"),
        (["--nope"], "plansim: no such option --nope: see 'plansim --help'"),
        (
            ["simulate", "-m", "gpt3-125m"],
            "plansim simulate: --strategy is required ('dp=8,tp=2,pp=1,...', a strategy YAML path or a shipped name): "
            "add --strategy ...",
        ),
        (["import"], "plansim import: CONFIG is required (a Hugging Face config.json"),
        (["nosuch"], "plansim: no such command 'nosuch': choose one of models, hardware, simulate"),
        (["simulat"], "plansim: no such command 'simulat': did you mean 'simulate'?"),
        (["plan", "--no-des=3"], "plansim plan: option '--no-des' does not take a value: see 'plansim plan --help'"),
        (["models", "--format", "a\nb"], "plansim models: --format: 'a\\nb' is not a valid choice"),
        ([*SIM, "extra"], "plansim simulate: got unexpected extra argument"),
    ],
)
def test_usage_errors_are_one_line(args: list[str], line: str) -> None:
    from typer.testing import CliRunner

    from plansim.cli.app import app

    r = CliRunner().invoke(app, args, prog_name="plansim")
    assert r.exit_code == 2, r.output
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.output
    assert r.stderr.startswith(line), (r.stderr, line)
    assert "Traceback" not in r.output and "╭" not in r.output and "Usage:" not in r.output


def test_a_long_bad_option_value_is_cut() -> None:
    from typer.testing import CliRunner

    from plansim.cli.app import app

    r = CliRunner().invoke(app, [*SIM, "--gpus", "9x" * 3000 + "\n"], prog_name="plansim")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and len(r.stderr) < 160, r.stderr


def test_help_still_works() -> None:
    from typer.testing import CliRunner

    from plansim.cli.app import app

    for args in (["--help"], ["simulate", "--help"], ["plan", "--help"]):
        r = CliRunner().invoke(app, args, prog_name="plansim")
        assert r.exit_code == 0 and "Usage: plansim" in r.stdout and "--help" in r.stdout, r.output
    r = CliRunner().invoke(app, [], prog_name="plansim")  # no arguments: the help, exit 2 (click's no_args_is_help)
    assert r.exit_code == 2 and "Usage: plansim" in r.output and "simulate" in r.output


def test_the_plansim_script_prints_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = "from plansim.cli.app import main; main()"
    r = subprocess.run([sys.executable, "-c", code, *SIM, "--gpus", "abc"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr == "plansim simulate: --gpus: 'abc' is not a valid integer: give a whole number, e.g. --gpus 8\n"
    ok = subprocess.run([sys.executable, "-c", code, "models", "--format", "json"], capture_output=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout.startswith(b"[")


@pytest.mark.parametrize(
    "args",
    [
        ["plan", "-m", "gpt3-125m", "-H", "dgx-a100", "-g", "8", "-B", "8", "--remat", "q" * 5000],
        ["compare", "-m", "gpt3-125m", "-H", "dgx-a100", "-g", "8", "-s", "dp=8", "--scaling", "q" * 5000],
        ["remat", "-m", "gpt3-125m", "-H", "dgx-a100", "--budget", "1GB", "--solver", "q" * 5000],
        ["remat", "--graph", "g.json", "--budget", "q" * 5000],
        [*SIM, "-e", "des", "--trace", "/" + "q" * 5000 + "/t.json"],
    ],
    ids=["plan-remat", "compare-scaling", "remat-solver", "remat-budget", "simulate-trace"],
)
def test_cli_option_values_are_echoed_short(args: list[str]) -> None:
    from typer.testing import CliRunner

    from plansim.cli.app import app

    r = CliRunner().invoke(app, args, prog_name="plansim")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert r.stderr.startswith("error: --") and "q" * 80 not in r.stderr, r.stderr
