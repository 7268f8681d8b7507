"""A strategy is resolved once per simulate call, at the engine's boundary: everything below it (the checks, the
step's preparation, the lowering, the analytic engine's cache) reads the resolved strategy and does not resolve it
again (``Strategy.resolved``); a strategy handed over resolved is not resolved again at all."""

from __future__ import annotations

import pytest

import plansim
from plansim.analytic import simulate_analytic
from plansim.hardware import Cluster, load_hardware
from plansim.strategy.schema import Strategy
from plansim.workload import load_model

STRATEGY = "dp=2,tp=2,pp=2,micro_batch=1,global_batch=16,zero=1"


def _count_resolves(monkeypatch: pytest.MonkeyPatch) -> list[Strategy]:
    """The strategies ``Strategy.resolve`` is called on from now on."""
    calls: list[Strategy] = []
    original = Strategy.resolve

    def counted(self: Strategy, cluster: Cluster) -> Strategy:
        calls.append(self)
        return original(self, cluster)

    monkeypatch.setattr(Strategy, "resolve", counted)
    return calls


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_one_simulate_call_resolves_its_strategy_once(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """16 micro-batches over 2 stages: the discrete-event engine sizes its run from a smaller lowering first
    (``plansim.des.size.sized_lowering``), two lowerings in all, each checked, none resolving again."""
    calls = _count_resolves(monkeypatch)
    result = plansim.simulate("gpt3-125m", "dgx-a100", STRATEGY, engine=engine)
    assert result.step_time_s > 0
    assert len(calls) == 1


def test_a_resolved_strategy_is_not_resolved_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Resolution is idempotent: a strategy handed over resolved prices as the one written, without a call."""
    model, cluster = load_model("gpt3-125m"), load_hardware("dgx-a100", gpus=8)
    written = Strategy.parse(STRATEGY)
    resolved = written.resolve(cluster)
    assert resolved.is_resolved and not written.is_resolved
    assert resolved.resolve(cluster) is resolved
    expected = simulate_analytic(model, cluster, written).to_dict()
    calls = _count_resolves(monkeypatch)
    assert simulate_analytic(model, cluster, resolved).to_dict() == expected
    assert calls == []
