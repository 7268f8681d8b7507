"""Generated inputs: every model, hardware and strategy file, inline strategy, CLI option and API call ends in a result
or a one-line ``PlansimError`` (CLI: exit 2), within a bounded time; ``--format json`` prints only JSON.

Hypothesis with a fixed seed (``derandomize``), so CI runs the same cases every time. Each case runs under an alarm:
a case past ``CASE_LIMIT_S`` is a hang and fails the test. ``CASES`` (about 2,200) split over the tests below; the
valid ones among them use small models, so the whole file takes about a minute.
"""

from __future__ import annotations

import json
import math
import resource
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from alarm import alarm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import plansim
from plansim.cli.app import app
from plansim.errors import PlansimError

CASE_LIMIT_S = 20.0
CASE_MEMORY = 4 * 2**30
MESSAGE_CHARS = 1000
FIXED = settings(
    derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck), print_blob=False
)
ROOT = Path(__file__).resolve().parent.parent

#: Values a user might put anywhere: plausible, boundary, absurd and ill-typed.
ODD_NUMBERS = [0, 1, 2, 3, 8, 12, 64, -1, -8, 2**31, 2**63, 2**64, 10**30, 0.5, 1e-9, 1e308, -1e308]
ODD_TEXT = ["", " ", "abc", "nan", "inf", "-inf", "1e400", "10" * 40, "x" * 300, "a,b", "k=v", "\t", "é", "None", "[1]"]
VALUES = st.one_of(
    st.sampled_from(ODD_NUMBERS),
    st.integers(-5, 100),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from(ODD_TEXT),
    st.text(max_size=8),
    st.booleans(),
    st.none(),
    st.lists(st.integers(-2, 16), max_size=4),
    st.dictionaries(st.sampled_from(["a", "b", "hidden"]), st.integers(0, 9), max_size=2),
)
TINY_MODEL = {"name": "fuzz", "family": "gpt", "layers": 2, "hidden": 256, "heads": 4, "seq_len": 256, "vocab": 1024}
STRATEGY_KEYS = [*plansim.Strategy.model_fields, "bogus", "", "DP", "tp "]
STRATEGY_VALUES = [
    "1", "2", "4", "8", "0", "-1", "3", "16", "1000000", "99999999999999999999999", "true", "false", "ring", "tree",
    "1f1b", "gpipe", "interleaved", "zb-h1", "selective", "full", "milp", "sqrt", "bf16", "fp16", "fp8", "1/1",
    "2/0", "nan", "inf", "1e9", "0.5", "", "x" * 80, "[1,2]", "{a: 1}", "'q'", "\"",
]  # fmt: skip


@contextmanager
def _bounded(what: str) -> Iterator[None]:
    """Fail (as a hang) when the block runs past ``CASE_LIMIT_S``; a case that asks for more than ``CASE_MEMORY``
    bytes beyond what the process maps already gets a MemoryError (a failure) instead of exhausting the machine."""
    mapped = int(Path("/proc/self/statm").read_text().split()[0]) * resource.getpagesize()
    limits = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (mapped + CASE_MEMORY, limits[1]))
    try:
        with alarm(CASE_LIMIT_S, what):
            yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, limits)


def _cli(args: list[str]) -> None:
    """Run the CLI in-process: exit 0 (and JSON when asked for) or exit 2 with one error line; never a traceback."""
    shown = " ".join(args)[:300]
    with _bounded(shown):
        result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 2), (
        f"plansim {shown}\nexit {result.exit_code}: {result.exception!r}\n{result.output}"
    )
    assert "Traceback" not in result.output, f"plansim {shown}\n{result.output}"
    if result.exit_code == 2:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert lines, f"plansim {shown}: exit 2 with nothing on stderr"
        # one line: a message lists at most a few problems, each value echoed short
        assert "╭" not in result.stderr and len(lines[-1]) <= MESSAGE_CHARS, f"plansim {shown}\n{result.stderr}"
    elif "json" in args:
        json.loads(result.stdout)


def _api(call: Callable[[], Any], shown: str) -> None:
    """Run an API call: a result or ``PlansimError``, nothing else."""
    with _bounded(shown):
        try:
            call()
        except PlansimError as err:
            assert "\n" not in str(err).strip(), f"{shown}: {err}"


def _dump(data: Any) -> str:
    try:
        return yaml.safe_dump(data, allow_unicode=True)
    except (yaml.YAMLError, ValueError, OverflowError):
        return repr(data)


def _mutated(base: dict[str, Any], changes: list[tuple[int, Any]], extra: Any) -> dict[str, Any]:
    """``base`` with some keys (nested ones too) set to odd values, or deleted (``...``), and maybe an unknown key."""
    out = json.loads(json.dumps(base))
    for index, value in changes:
        target, keys = out, list(out)
        while True:
            key = keys[index % len(keys)]
            if isinstance(target[key], dict) and target[key] and index % 3 == 0:
                target, keys, index = target[key], list(target[key]), index // 3
                continue
            if isinstance(target[key], list) and target[key] and isinstance(target[key][0], dict) and index % 2 == 0:
                target = target[key][index % len(target[key])]
                keys, index = list(target), index // 2
                continue
            break
        if value is Ellipsis:
            del target[key]
        else:
            target[key] = value
    if extra is not None:
        out["unexpected_key"] = extra
    return out


CHANGES = st.lists(st.tuples(st.integers(0, 1000), st.one_of(VALUES, st.just(Ellipsis))), min_size=0, max_size=3)
NASTY_TEXT = st.one_of(
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.text(max_size=200),
    st.sampled_from([
        "[" * 5000, "{a: " * 3000, "a: &x [1]\nb: *x\n", "a: 1\na: 2\n", "!!python/object:os.system {}", "---\n...\n",
        "name: x\nfamily: gpt\nlayers: 1e30\n", "layers: " + "9" * 5000, "\x00\x01", "key: [unclosed",
    ]),
)  # fmt: skip


@settings(FIXED, max_examples=450)
@given(changes=CHANGES, extra=st.one_of(st.none(), VALUES), nasty=st.one_of(st.none(), NASTY_TEXT))
def test_model_files(tmp_path_factory: pytest.TempPathFactory, changes: list, extra: Any, nasty: str | None) -> None:
    path = tmp_path_factory.mktemp("m") / "model.yaml"
    text = nasty if nasty is not None else _dump(_mutated(TINY_MODEL, changes, extra))
    path.write_bytes(text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text)
    _cli(["simulate", "-m", str(path), "-H", "dgx-a100", "-s", "dp=2,tp=2,micro_batch=1,global_batch=4", "-f", "json"])


_NODE = yaml.safe_load((ROOT / "hardware_profiles" / "nodes" / "dgx-a100.yaml").read_text())


@settings(FIXED, max_examples=350)
@given(changes=CHANGES, extra=st.one_of(st.none(), VALUES), nasty=st.one_of(st.none(), NASTY_TEXT))
def test_hardware_files(tmp_path_factory: pytest.TempPathFactory, changes: list, extra: Any, nasty: str | None) -> None:
    path = tmp_path_factory.mktemp("h") / "node.yaml"
    text = nasty if nasty is not None else _dump(_mutated(_NODE, changes, extra))
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    _cli(["simulate", "-m", "gpt3-125m", "-H", str(path), "-g", "16", "-s", "dp=8,tp=2", "-f", "json"])


INLINE = st.lists(
    st.tuples(st.sampled_from(STRATEGY_KEYS), st.sampled_from(STRATEGY_VALUES)), min_size=0, max_size=5
).map(lambda pairs: ",".join(f"{k}={v}" for k, v in pairs))


@settings(FIXED, max_examples=450)
@given(
    inline=st.one_of(INLINE, st.sampled_from(["", " ", ",", "=", "dp", "data-parallel", "zero3", "no-such", "a=b=c"])),
    gpus=st.sampled_from([None, "8", "16", "0", "-4", "7", "abc", "1e3", str(2**64), "65536"]),
    engine=st.sampled_from(["analytic", "analytic", "des", "bogus"]),
    fmt=st.sampled_from(["json", "table", "csv", "xml"]),
)
def test_inline_strategies(inline: str, gpus: str | None, engine: str, fmt: str) -> None:
    args = ["simulate", "-m", "gpt3-125m", "-H", "dgx-a100", "-s", inline, "-e", engine, "-f", fmt]
    if gpus is not None:
        args += ["-g", gpus]
    _cli(args)


@settings(FIXED, max_examples=250)
@given(
    fields=st.dictionaries(st.sampled_from(STRATEGY_KEYS), VALUES, max_size=5), nasty=st.one_of(st.none(), NASTY_TEXT)
)
def test_strategy_files(tmp_path_factory: pytest.TempPathFactory, fields: dict, nasty: str | None) -> None:
    path = tmp_path_factory.mktemp("s") / "strategy.yaml"
    path.write_bytes((nasty if nasty is not None else _dump(fields)).encode("utf-8", "surrogateescape"))
    _cli(["simulate", "-m", "gpt3-125m", "-H", "dgx-a100", "-g", "8", "-s", str(path), "-f", "json"])


OPTION_VALUES = st.sampled_from(
    ["0", "1", "2", "8", "16", "64", "-1", "nan", "inf", "1e308", "abc", "", str(2**63), str(2**64), "0.5", "3=1.5",
     "node0/nic0=0.5", "leaf0=0", "spine0", "u--v", "x" * 300, "1,2", "none", "full", "milp"]
)  # fmt: skip
SIMULATE_OPTIONS = ["--gpus", "--mode", "--straggler", "--degrade-link", "--fail-link", "--jitter", "--seed", "--bogus"]
PLAN_OPTIONS = [
    "--gpus", "--tp", "--pp", "--max-pp", "--zero", "--micro-batch", "--schedule", "--remat", "--objective", "--top",
    "--jobs", "--tokens", "--price-per-gpu-hour", "--bogus",
]  # fmt: skip


@settings(FIXED, max_examples=300)
@given(options=st.lists(st.tuples(st.sampled_from(SIMULATE_OPTIONS), OPTION_VALUES), max_size=4))
def test_simulate_options(options: list[tuple[str, str]]) -> None:
    args = ["simulate", "-m", "gpt3-125m", "-H", "dgx-a100", "-s", "dp=2,tp=2,pp=2,micro_batch=1,global_batch=8"]
    args += ["-e", "des", "-f", "json"]
    for option, value in options:
        args += [option, value]
    _cli(args)


@settings(FIXED, max_examples=200)
@given(
    options=st.lists(st.tuples(st.sampled_from(PLAN_OPTIONS), OPTION_VALUES), max_size=3),
    batch=st.sampled_from(["8", "16", "0", "-8", "nan", "abc", str(2**63), "9223372036854775808", "1000000000"]),
)
def test_plan_options(options: list[tuple[str, str]], batch: str) -> None:
    args = ["plan", "-m", "mlp-small", "-H", "dgx-a100", "-B", batch, "-g", "8", "--no-des", "-f", "json"]
    for option, value in options:
        if option == "--jobs" and value.isdigit() and int(value) > 1:
            value = "1"  # worker processes are the pool's business, not an input case
        args += [option, value]
    _cli(args)


REMAT_OPTIONS = [
    "--stage-layers", "--solver", "--time-limit", "--gap", "--granularity", "--micro-batch", "--tp", "--hardware",
    "--bogus",
]  # fmt: skip
BUDGETS = ["2GB", "512MB", "20GiB", "0", "-1GB", "1e9", "abc", "", "nan GB", "1e400", str(2**64), "1.5TB"]


@settings(FIXED, max_examples=150)
@given(
    options=st.lists(st.tuples(st.sampled_from(REMAT_OPTIONS), OPTION_VALUES), max_size=3),
    budget=st.sampled_from(BUDGETS),
)
def test_remat_options(options: list[tuple[str, str]], budget: str) -> None:
    """The MILP under a 2 s limit unless a case sets its own (which must then be bounded too)."""
    args = ["remat", "-m", "gpt3-125m", "-b", budget, "-k", "1", "--granularity", "layer", "--time-limit", "2"]
    for option, value in options:
        args += [option, value]
    _cli([*args, "-f", "json"])


_HF = {path.stem: json.loads(path.read_text()) for path in sorted((ROOT / "tests" / "data" / "hf").glob("*.json"))}


@settings(FIXED, max_examples=200)
@given(
    config=st.sampled_from(sorted(_HF)),
    changes=CHANGES,
    extra=st.one_of(st.none(), VALUES),
    nasty=st.one_of(st.none(), NASTY_TEXT),
)
def test_import_configs(
    tmp_path_factory: pytest.TempPathFactory, config: str, changes: list, extra: Any, nasty: str | None
) -> None:
    """A Hugging Face config.json, mutated, imported to a model file; what imports must then simulate."""
    folder = tmp_path_factory.mktemp("hf")
    path = folder / "config.json"
    text = nasty if nasty is not None else json.dumps(_mutated(_HF[config], changes, extra), default=repr)
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    out = folder / "model.yaml"
    _cli(["import", str(path), "--out", str(out)])
    assert path.read_bytes() == text.encode("utf-8", "surrogateescape"), "import changed its input"
    if out.exists():
        _cli(["simulate", "-m", str(out), "-H", "dgx-a100", "-g", "8", "-s", "dp=8,micro_batch=1,global_batch=8"])


# Mostly valid arguments (so that most calls run a step), each with odd ones among them.
API_MODELS = st.one_of(
    st.sampled_from(["gpt3-125m", "mlp-small"]), st.sampled_from(["no-such-model", "", None, 3, ["gpt3-125m"]])
)
API_HARDWARE = st.one_of(
    st.sampled_from(["dgx-a100", "dgx-h100"]), st.sampled_from(["no-such-node", "", None, 8, {"name": "x"}])
)
API_STRATEGIES = st.one_of(
    st.sampled_from(["dp=8", "dp=4,tp=2", "dp=2,pp=4,micro_batch=1,global_batch=8", "data-parallel"]),
    INLINE,
    st.sampled_from([None, 8, {}, {"dp": 2, "tp": 2}, {"dp": "x"}, {"tp": math.nan}, []]),
)


@settings(FIXED, max_examples=300)
@given(
    model=API_MODELS,
    hardware=API_HARDWARE,
    strategy=API_STRATEGIES,
    keywords=st.dictionaries(
        st.sampled_from(["gpus", "engine", "mode", "stragglers", "link_factors", "failed_links", "jitter", "seed"]),
        VALUES,
        max_size=3,
    ),
)
def test_simulate_calls(model: Any, hardware: Any, strategy: Any, keywords: dict[str, Any]) -> None:
    _api(
        lambda: plansim.simulate(model, hardware, strategy, **keywords),
        f"simulate({model!r}, {hardware!r}, {strategy!r}, **{keywords!r})"[:300],
    )


@settings(FIXED, max_examples=120)
@given(
    keywords=st.dictionaries(
        st.sampled_from(["gpus", "global_batch", "constraints", "objective", "top_k", "des", "jobs", "tokens"]),
        VALUES,
        max_size=3,
    ),
)
def test_plan_calls(keywords: dict[str, Any]) -> None:
    call = {"gpus": 8, "global_batch": 16, "des": False, **keywords}
    if type(call.get("jobs")) is int and call["jobs"] > 1:
        call["jobs"] = 1  # worker processes are not an input case
    _api(lambda: plansim.plan("mlp-small", "dgx-a100", **call), f"plan('mlp-small', 'dgx-a100', **{call!r})"[:300])
