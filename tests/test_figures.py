"""The figures README.md and docs/ quote are the code's: every marked figure (``scripts/figures.py``) names a run of
``docs/figures.yaml`` and a path into its output, and each figure of the suite's runs equals what the code gives now.
The release runs (large plans) are checked by ``python scripts/figures.py --check --all`` before a release."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _figures_module():  # type: ignore[no-untyped-def]
    path = ROOT / "scripts" / "figures.py"
    if not path.exists():
        pytest.skip("scripts/ is not installed")
    spec = importlib.util.spec_from_file_location("figures", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["figures"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


F = _figures_module()


def test_every_marked_figure_names_a_run_a_path_and_a_format() -> None:
    runs = F.Runs()
    marked = F.figures()
    assert len(marked) >= 3
    for f in marked:
        assert f.run in runs.spec, f
        assert runs.cost(f.run) in ("suite", "release"), f
        unit = f.fmt.partition(".")[0]
        assert f.fmt in ("int", "text", "code", "wrap120", "fence120", "fence", "slash") or unit in F.FORMATS, f
    used = {f.run for f in marked}
    assert used == set(runs.spec), f"runs no figure reads: {set(runs.spec) - used}"


def test_the_suites_figures_are_what_the_code_gives() -> None:
    problems = F.check(F.Runs())
    assert not problems, "\n".join(problems)


def test_a_changed_figure_is_found_and_rewritten(tmp_path: Path) -> None:
    """The check fails on a quoted figure the code does not give, and --update writes the code's (once more: no
    change)."""
    runs = F.Runs()
    page = tmp_path / "page.md"
    page.write_text("split <!-- fig split_plan winner.layer_split slash -->6/6/6/6<!-- /fig --> here\n")
    assert len(F.check(runs, pages=[page])) == 1
    assert F.update(runs, pages=[page]) == 1
    assert F.check(runs, pages=[page]) == []
    assert F.update(runs, pages=[page]) == 0
    assert "<!-- fig split_plan winner.layer_split slash -->" in page.read_text()


@pytest.mark.parametrize(
    "value,fmt,text",
    [(0.52549, "s.3", "0.525"), (1.0665, "ms.1", "1,066.5"), (0.628, "pct.1", "62.8"), (25776, "int", "25,776"),
     (1.983e10, "GB.2", "19.83"), ([5, 7, 7, 5], "slash", "5/7/7/5")],
)  # fmt: skip
def test_formats(value: object, fmt: str, text: str) -> None:
    assert F.render(value, fmt) == text


def test_a_bad_format_or_path_is_named() -> None:
    with pytest.raises(ValueError, match=r"UNIT\.DECIMALS"):
        F.render(1.0, "furlongs.2")
    with pytest.raises(KeyError, match="no 'nope'"):
        F.resolve({"a": {"b": 1}}, "a.nope")
