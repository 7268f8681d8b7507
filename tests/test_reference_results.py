"""A change of structure changes no figure: the reference set (``scripts/reference_results.py``: every collective,
ZeRO stage, schedule x remat policy, framework, what-if and a planner ranking, both engines) recomputed and compared
with the stored one within 1e-12 relative. A change that is meant to move figures re-writes the reference
(``python scripts/reference_results.py --write``) and says so in its commit."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "reference_results.py"


def _script():
    spec = importlib.util.spec_from_file_location("reference_results", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reference_results_unchanged() -> None:
    script = _script()
    expected = json.loads(script.REFERENCE.read_text(encoding="utf-8"))
    found = script.differences(expected, script.compute())
    assert not found, f"{len(found)} differences, first: " + "\n".join(found[:20])


def test_differences_sees_a_change() -> None:
    """The comparison itself can fail: a value moved past the tolerance, a missing field and a missing case."""
    script = _script()
    base = {"a": {"x": 1.0, "y": "words"}}
    assert script.differences(base, {"a": {"x": 1.0 + 1e-13, "y": "words"}}) == []
    assert script.differences(base, {"a": {"x": 1.0 + 1e-9, "y": "words"}})
    assert script.differences(base, {"a": {"x": 1.0}})
    assert script.differences(base, {})
