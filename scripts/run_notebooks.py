"""Execute the notebooks in ``notebooks/`` in place, storing their outputs, so that they read on GitHub.

Each notebook runs top to bottom in a fresh ``python3`` kernel (nbclient, the executor nbmake also uses) started in
``notebooks/``, with matplotlib's inline backend, and is written back with its outputs. What would change from run
to run is left out, so that running the script twice on the same code gives byte-identical files: no execution
timestamps (``record_timing`` off), the notebook's metadata reduced to its fixed kernel, the random ids that
pandas' ``Styler`` puts in its HTML replaced by ids numbered per cell, object addresses cut from default reprs,
and libraries' timestamped diagnostics and banners (torch's profiler, HiGHS) cut from the streams. A notebook
that fails stops the script (exit 1) and is left as it was. One notebook cannot repeat itself exactly:
06_validation times real training steps on this machine's CPU, so its measured figures and chart change with
every run.

Usage::

    python scripts/run_notebooks.py                  # every notebook at full size (as run by hand)
    python scripts/run_notebooks.py 02_allreduce     # the notebooks named (file name, with or without .ipynb)
    python scripts/run_notebooks.py --small          # PLANSIM_SMALL=1: the sizes the tests run (quicker)
    python scripts/run_notebooks.py --check          # run into memory and say which committed files differ

At full size (not ``--small``) a notebook's narrative figures are checked too: a markdown cell quotes a figure with
scripts/figures.py's marker naming the run ``nb`` (``<!-- fig nb h200.gain pct.1 -->13.2<!-- /fig -->``), read
from the ``FIGURES`` dict the notebook's code builds; a run rewrites each from what the code computed, ``--check``
reports those that differ. Run before a release: the notebooks' narrative then says what their full-size outputs
show (under pytest they run at the small sizes, whose figures differ).

``pytest --nbmake`` runs the same notebooks (at the small sizes, ``conftest.py``) and ignores stored outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["KERNEL", "main", "normalise", "notebooks", "run_notebook"]

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"

#: The notebook metadata every executed notebook carries (the kernel it runs with, nothing that varies by machine).
KERNEL = {
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}
#: Seconds one cell may run before the notebook fails.
CELL_TIMEOUT_S = 3600
#: pandas' Styler ids: ``T_`` and a random hex uuid (five characters by default), as in ``id="T_1a2b3_row0_col1"``.
_STYLER_ID = re.compile(r"T_([0-9a-f]{5})(?=[_\"\s#.{])")
#: Lines that libraries write around a cell's own output, with timestamps or in some runs only: torch's profiler
#: (kineto) on stderr, ``USDT:<date> <time> ... profiler_start``, and the HiGHS solver's banner.
_NOISE = re.compile(r"^(USDT:\d{4}-\d\d-\d\d .*|Running HiGHS .*|Includes third-party software components.*)\n?$")
#: An object's default repr, ``<pandas.io.formats.style.Styler at 0x7f3a2c1d0e50>``: its address changes each run.
_ADDRESS = re.compile(r"(<[\w.]+) at 0x[0-9a-f]+>")


def notebooks(names: list[str] | None = None) -> list[Path]:
    """The notebooks named (``02_allreduce`` or ``02_allreduce.ipynb``), or every one in order."""
    every = sorted(NOTEBOOKS.glob("*.ipynb"))
    if not names:
        return every
    chosen = []
    for name in names:
        path = NOTEBOOKS / (name if name.endswith(".ipynb") else f"{name}.ipynb")
        if path not in every:
            raise SystemExit(
                f"{name}: no such notebook in {NOTEBOOKS} (choose from {', '.join(p.stem for p in every)})"
            )
        chosen.append(path)
    return chosen


def normalise(nb: Any) -> Any:
    """``nb`` without what changes from run to run (see the module docstring); returns it."""
    nb.metadata = {key: dict(value) for key, value in KERNEL.items()}
    for k, cell in enumerate(nb.cells):
        cell.metadata.pop("execution", None)
        if "outputs" in cell:
            cell.outputs = [output for output in cell.outputs if _without_noise(output)]
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "text/html" in data:
                data["text/html"] = _stable_styler_ids(data["text/html"], k)
            if "text/plain" in data:
                data["text/plain"] = _without_addresses(data["text/plain"])
    return nb


def _stable_styler_ids(html: str | list[str], cell: int) -> str | list[str]:
    """Styler's random ids numbered in order of appearance within the cell: ``T_c07s1`` (cell 7, first table)."""
    text = "".join(html) if isinstance(html, list) else html
    ids: dict[str, str] = {}
    for match in _STYLER_ID.finditer(text):
        ids.setdefault(match.group(1), f"c{cell:02d}s{len(ids) + 1}")
    text = _STYLER_ID.sub(lambda m: f"T_{ids[m.group(1)]}", text)
    return text.splitlines(keepends=True) if isinstance(html, list) else text


def _without_noise(output: Any) -> bool:
    """Drop the ``_NOISE`` lines from a stream output; False when nothing else is left in it."""
    if output.get("output_type") != "stream":
        return True
    text = "".join(output["text"]) if isinstance(output["text"], list) else output["text"]
    kept = [line for line in text.splitlines(keepends=True) if not _NOISE.match(line)]
    output["text"] = "".join(kept)
    return bool(kept)


def _without_addresses(text: str | list[str]) -> str | list[str]:
    """Default reprs without their object's address: ``<pandas.io.formats.style.Styler>``."""
    if isinstance(text, list):
        return [_ADDRESS.sub(r"\1>", line) for line in text]
    return _ADDRESS.sub(r"\1>", text)


def run_notebook(path: Path, *, small: bool = False) -> Any:
    """Execute the notebook at ``path`` in a fresh kernel started in its folder; returns it, normalised."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    env = {key: value for key, value in os.environ.items() if key != "MPLBACKEND"}  # the kernel's inline backend
    env["PLANSIM_SMALL"] = "1" if small else "0"
    env["PYTHONHASHSEED"] = "0"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name=KERNEL["kernelspec"]["name"],
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
    )
    probe = nbformat.v4.new_code_cell(_FIGURES_PROBE)  # run after the notebook's cells, then taken out again
    nb.cells.append(probe)
    client.execute(env=env)
    nb.cells.remove(probe)
    streams = [o for o in probe.get("outputs", []) if o.get("output_type") == "stream"]
    nb = normalise(nb)
    nb.metadata["plansim_figures"] = json.loads("".join(o["text"] for o in streams) or "{}")  # main takes it out
    return nb


#: Prints the notebook's ``FIGURES`` dict (what its narrative quotes), as JSON.
_FIGURES_PROBE = "import json as _json\nprint(_json.dumps(globals().get('FIGURES', {}), default=float))"


def narrative_figures(nb: Any, figures: dict[str, Any], *, update: bool) -> list[str]:
    """The narrative's marked figures (``<!-- fig nb KEY FORMAT -->``, scripts/figures.py's markers with the run
    ``nb``: the notebook's ``FIGURES`` dict) against what the run computed: one line per figure that differs (or
    names no key), and, with ``update``, each rewritten from the run. Markers of other runs are left alone."""
    from figures import MARKER, render, resolve

    problems: list[str] = []
    for k, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue

        def fresh(m: Any, k: int = k) -> str:
            run, key, fmt, quoted = m.groups()
            if run != "nb":
                return m.group(0)
            try:
                actual = render(resolve(figures, key), fmt)
            except (KeyError, IndexError, ValueError, TypeError) as exc:
                problems.append(f"cell {k}: {key}: {exc}")
                return m.group(0)
            if actual != quoted:
                problems.append(f"cell {k}: {key} quotes {quoted!r}, the run gives {actual!r}")
            return f"<!-- fig nb {key} {fmt} -->{actual if update else quoted}<!-- /fig -->"

        cell.source = MARKER.sub(fresh, cell.source)
    return problems


def main(argv: list[str] | None = None) -> int:
    """Run the notebooks named (every one by default) and write each back, or with ``--check`` compare."""
    import nbformat

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebooks to run (default: every one)")
    parser.add_argument("--small", action="store_true", help="PLANSIM_SMALL=1: the sizes the tests run")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a committed file differs")
    args = parser.parse_args(argv)
    differ = []
    for path in notebooks(args.names):
        start = time.perf_counter()
        print(f"{path.name}: running", flush=True)
        try:
            nb = run_notebook(path, small=args.small)
        except Exception as err:  # a failing cell: say which notebook and stop, the file left as it was
            print(f"{path.name}: failed: {str(err).strip().splitlines()[-1] if str(err).strip() else err!r}")
            return 1
        figures = nb.metadata.pop("plansim_figures", {})
        problems = [] if args.small else narrative_figures(nb, figures, update=not args.check)
        for line in problems:
            print(f"{path.name}: {line}")
        text = nbformat.writes(nb) + "\n"
        elapsed = time.perf_counter() - start
        if args.check:
            same = path.read_text(encoding="utf-8") == text and not problems
            print(f"{path.name}: {'unchanged' if same else 'differs'} ({elapsed:.0f} s)")
            differ += [] if same else [path.name]
            continue
        path.write_text(text, encoding="utf-8")
        print(f"{path.name}: written ({elapsed:.0f} s)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
