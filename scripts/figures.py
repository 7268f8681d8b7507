"""The figures README.md and docs/*.md quote from plansim's own output, checked against the code and refreshed by one
command.

A quoted figure is marked where it stands, invisibly in the rendered page::

    the even split takes <!-- fig split_even step_time_s s.3 -->0.569<!-- /fig --> s

``split_even`` names a run of ``docs/figures.yaml`` (a plansim command line whose ``--format json`` output the figure
is read from, Python code that leaves a table's text or data in ``result``, or a page's own ```python block, whose
printed output is ``stdout``), ``step_time_s`` the path into that
output (keys and list indexes, dot-separated) and ``s.3`` how it is written (``UNIT.DECIMALS``, ``FORMATS``). A run's
``cost`` says where it is checked: ``suite`` runs are cheap and ``tests/test_figures.py`` checks their figures in
every test run; ``release`` runs (the README's main plan of GPT-3 175B on 1,024 GPUs takes about a minute) are
checked by this script before a release. Timings of plansim itself (a command's seconds) are measurements, not
figures of the code, and are not marked.

Usage::

    python scripts/figures.py --check          # the suite's runs: every marked figure equal to what the code gives
    python scripts/figures.py --check --all    # every run, the release ones too
    python scripts/figures.py --update --all   # rewrite every marked figure from a fresh run
    python scripts/figures.py --list           # the runs, their cost and how many figures each feeds
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = ["FORMATS", "Figure", "Runs", "check", "figures", "render", "resolve", "update"]

ROOT = Path(__file__).resolve().parent.parent
RUNS_FILE = ROOT / "docs" / "figures.yaml"
#: <!-- fig RUN PATH FORMAT -->quoted text<!-- /fig -->
MARKER = re.compile(r"<!-- fig (\S+) (\S+) (\S+) -->(.*?)<!-- /fig -->", re.S)
#: UNIT -> (scale applied to the JSON value, thousands separators): ``s.3`` 0.569, ``ms.1`` 1,066.5, ``GB.2``
#: 19.83, ``pct.1`` 62.8 (a fraction in the JSON), ``int`` 25,776, ``num.2`` as the JSON has it; ``text`` a string as
#: it is, ``wrap120`` a string (or a list of sentences) filled to 120 columns (each of its lines a paragraph),
#: ``fence120`` that as a fenced block (the marker around the fences: a comment inside a fence would show), ``fence``
#: a text as a fenced block as it is, ``code`` a string as a code span, ``slash`` a list as 5/7/7/5
FORMATS: dict[str, float] = {"s": 1.0, "ms": 1e3, "us": 1e6, "GB": 1e-9, "GiB": 2**-30, "pct": 100.0, "num": 1.0}


def files() -> list[Path]:
    """The pages whose figures are marked: README.md and every page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Figure:
    """One marked figure: where it is (file, line), what it reads (run, path, format) and what the page says."""

    path: Path
    line: int
    run: str
    key: str
    fmt: str
    quoted: str


def figures(pages: Iterable[Path] | None = None) -> list[Figure]:
    """Every marked figure of ``pages`` (default: ``files()``), in page order."""
    out = []
    for page in files() if pages is None else pages:
        text = page.read_text()
        for m in MARKER.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append(Figure(page, line, m.group(1), m.group(2), m.group(3), m.group(4)))
    return out


def resolve(data: Any, key: str) -> Any:
    """The value at ``key`` of a run's JSON output: dot-separated keys and list indexes; a key with spaces by the
    start of it, ``_`` for each space (``rejected.does_not_fit:_weights``); ``*`` the sum of a dict's or a list's
    values."""
    value = data
    for part in key.split("."):
        if part == "*" and isinstance(value, dict | list):
            value = sum(value.values() if isinstance(value, dict) else value)
        elif isinstance(value, list):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, dict) and len(hits := [k for k in value if k.replace(" ", "_").startswith(part)]) == 1:
            value = value[hits[0]]
        else:
            raise KeyError(f"{key}: no '{part}' in {type(value).__name__}")
    return value


def render(value: Any, fmt: str) -> str:
    """``value`` written as ``fmt`` says (``FORMATS``)."""
    if fmt == "text":
        return str(value)
    if fmt == "code":  # a code span: the marker outside it (a comment inside one would show)
        return f"`{value}`"
    if fmt == "slash":
        return "/".join(str(v) for v in value)
    if fmt in ("wrap120", "fence120"):
        prose = " ".join(value) if isinstance(value, list) else str(value)  # a list of sentences: one paragraph
        text = "\n".join(textwrap.fill(p, 120, break_on_hyphens=False) for p in prose.split("\n"))
        return text if fmt == "wrap120" else f"\n```\n{text}\n```\n"
    if fmt == "fence":
        return f"\n```\n{value}\n```\n"
    if fmt == "int":
        return f"{round(float(value)):,}"
    unit, _, decimals = fmt.partition(".")
    if unit not in FORMATS or not decimals.isdigit():
        raise ValueError(
            f"format {fmt!r}: UNIT.DECIMALS with UNIT one of {', '.join(FORMATS)}, or int, text, code, wrap120, "
            "fence120, fence, slash"
        )
    return f"{float(value) * FORMATS[unit]:,.{int(decimals)}f}"


class Runs:
    """The runs of ``docs/figures.yaml``, each run once (in this process, through the CLI's app) when first read."""

    def __init__(self, path: Path = RUNS_FILE) -> None:
        spec = yaml.safe_load(path.read_text())["runs"]
        self.spec: dict[str, dict[str, str]] = spec
        self._out: dict[str, Any] = {}

    def cost(self, run: str) -> str:
        return self.spec[run]["cost"]

    def output(self, run: str) -> Any:
        if run not in self._out:
            spec = self.spec[run]
            if "snippet" in spec:
                self._out[run] = _snippet(ROOT / spec["snippet"], int(spec.get("block", 0)))
            elif "python" in spec:
                self._out[run] = _evaluate(spec["python"])
            else:
                self._out[run] = _invoke(spec["command"])
        return self._out[run]


def _snippet(page: Path, block: int) -> dict[str, str]:
    """What the ``block``-th ```python block of ``page`` prints (``{"stdout": ...}``) and the records of each
    DataFrame it leaves (``frame``: a list of rows): the page's own code is the run, so the output shown under it is
    what that code prints."""
    import contextlib
    import io

    code = re.findall(r"```python\n(.*?)```", page.read_text(), re.S)[block]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        scope = _evaluate(code + "\nresult = {k: v for k, v in globals().items() if hasattr(v, 'to_dict')}\n")
    tables = {name: frame.to_dict("records") for name, frame in scope.items() if hasattr(frame, "columns")}
    return {"stdout": out.getvalue().rstrip("\n"), **tables}


def _evaluate(code: str) -> Any:
    """What a run's ``python`` code leaves in ``result`` (plansim imported as ``plansim``): a table's text, or data
    its figures read."""
    import plansim

    os.environ["PLANSIM_PROGRESS"] = "off"
    scope: dict[str, Any] = {"plansim": plansim}
    exec(code, scope)
    return scope["result"]


def _invoke(command: str) -> Any:
    """A plansim command line's ``--format json`` output, run in this process (no progress lines)."""
    from typer.testing import CliRunner

    from plansim.cli.app import app

    os.environ["PLANSIM_PROGRESS"] = "off"
    args = shlex.split(command)
    if args and args[0] == "plansim":
        args = args[1:]
    result = CliRunner().invoke(app, [*args, "--format", "json"], catch_exceptions=False)
    if result.exit_code != 0:
        raise RuntimeError(f"plansim {command}: exit {result.exit_code}: {result.output.strip()[-300:]}")
    return json.loads(result.stdout)


def _chosen(runs: Runs, every: bool) -> set[str]:
    return {name for name in runs.spec if every or runs.cost(name) == "suite"}


def check(runs: Runs, every: bool = False, pages: Iterable[Path] | None = None) -> list[str]:
    """One line per marked figure (of the suite's runs, or ``every`` run) that differs from what the code gives, or
    names a run, path or format that does not exist."""
    problems = []
    chosen = _chosen(runs, every)
    for f in figures(pages):
        where = f"{f.path.relative_to(ROOT) if f.path.is_relative_to(ROOT) else f.path}:{f.line}"
        if f.run not in runs.spec:
            problems.append(f"{where}: run '{f.run}' is not in {RUNS_FILE.relative_to(ROOT)}")
            continue
        if f.run not in chosen:
            continue
        try:
            actual = render(resolve(runs.output(f.run), f.key), f.fmt)
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            problems.append(f"{where}: {f.run} {f.key}: {exc}")
            continue
        if actual != f.quoted:
            problems.append(
                f"{where}: {f.run} {f.key} quotes {f.quoted!r}, the code gives {actual!r} "
                f"(refresh: python scripts/figures.py --update{' --all' if runs.cost(f.run) != 'suite' else ''})"
            )
    return problems


def update(runs: Runs, every: bool = False, pages: Iterable[Path] | None = None) -> int:
    """Rewrite the marked figures (of the suite's runs, or ``every`` run) from the code; returns how many changed."""
    chosen = _chosen(runs, every)
    changed = 0
    for page in files() if pages is None else pages:
        text = page.read_text()

        def fresh(m: re.Match[str]) -> str:
            nonlocal changed
            run, key, fmt, quoted = m.groups()
            if run not in chosen:
                return m.group(0)
            actual = render(resolve(runs.output(run), key), fmt)
            changed += actual != quoted
            return f"<!-- fig {run} {key} {fmt} -->{actual}<!-- /fig -->"

        new = MARKER.sub(fresh, text)
        if new != text:
            page.write_text(new)
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true", help="say which marked figures differ from the code")
    action.add_argument("--update", action="store_true", help="rewrite the marked figures from the code")
    action.add_argument("--list", action="store_true", help="the runs, their cost and their figures")
    parser.add_argument("--all", action="store_true", help="the release runs too, not only the suite's")
    args = parser.parse_args()
    runs = Runs()
    if args.list:
        counts: dict[str, int] = {}
        for f in figures():
            counts[f.run] = counts.get(f.run, 0) + 1
        for name, spec in runs.spec.items():
            what = f"plansim {spec['command']}" if "command" in spec else "python"
            print(f"{name:<24} {spec['cost']:<8} {counts.get(name, 0):>3} figures  {what}")
        return
    if args.update:
        print(f"{update(runs, args.all)} figures changed")
        return
    problems = check(runs, args.all)
    for line in problems:
        print(line)
    print(f"{len(figures())} marked figures, {len(problems)} differ")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
