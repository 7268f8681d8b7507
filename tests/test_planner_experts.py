"""The planner's search over expert parallelism (issue 36): which (ep, etp) it tries, counted as it enumerates, and
what its explanation says ep bought."""

from __future__ import annotations

import pytest

from plansim.hardware import load_hardware
from plansim.planner import plan
from plansim.planner.space import Constraints, _experts, candidates, count_candidates
from plansim.strategy.checks import expert_problems
from plansim.strategy.schema import Strategy
from plansim.workload import load_model


@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "fsdp"])
@pytest.mark.parametrize(("tp", "cp", "dp"), [(1, 1, 8), (2, 1, 4), (2, 2, 2), (4, 1, 16)])
def test_expert_degrees_are_those_the_checks_let_run(framework: str, tp: int, cp: int, dp: int) -> None:
    """Brute force: every ep dividing the experts, with the framework's default etp or 1, that the checks let run
    (``checks.expert_problems``) and no other; etp None where it is the default."""
    model = load_model("mixtral-8x7b")
    got = set(_experts(model, tp, cp, dp, Constraints(), framework))
    want = set()
    for ep in range(1, model.experts + 1):
        for etp in (None, 1):
            s = Strategy(dp=dp, tp=tp, cp=cp, ep=ep, etp=etp, sequence_parallel=tp > 1, framework=framework)
            if etp is not None and etp == s.model_copy(update={"etp": None}).expert_tp:
                continue  # the default, named: the search leaves it None
            if ep == 1 and etp is not None:
                continue  # without ep the experts take the tensor-parallel ranks (the search keeps to them)
            if not expert_problems(s, model):
                want.add((ep, etp))
    assert got == want


def test_a_dense_model_searches_ep_1_only_and_a_fixed_ep_alone() -> None:
    dense, moe = load_model("llama3-8b"), load_model("mixtral-8x7b")
    assert _experts(dense, 2, 1, 4, Constraints(), "megatron") == [(1, None)]
    assert _experts(dense, 2, 1, 4, Constraints(ep=2), "megatron") == []
    assert _experts(moe, 1, 1, 8, Constraints(ep=4), "megatron") == [(4, None)]
    assert _experts(moe, 1, 1, 8, Constraints(ep=3), "megatron") == []  # 3 does not divide 8 experts


def test_the_count_of_candidates_is_what_the_enumeration_yields_for_a_moe_model() -> None:
    model, cluster = load_model("qwen3-30b-a3b"), load_hardware("dgx-h100", gpus=16)
    c = Constraints(max_pp=2)
    listed = list(candidates(model, cluster, 64, c))
    assert count_candidates(model, cluster, 64, c) == len(listed)
    assert {s.ep for s in listed} == {1, 2, 4, 8, 16}
    assert all(s.sequence_parallel for s in listed if s.tp > 1)  # Megatron's MoE layer needs it with tp


def test_the_plan_of_a_moe_model_says_what_expert_parallelism_bought() -> None:
    r = plan(
        "qwen3-30b-a3b", "dgx-h100", gpus=8, global_batch=64, seq_len=1024, des=False, milp=False,
        constraints=Constraints(max_pp=1),
    )  # fmt: skip
    winner = r.outcome.finalists[0].priced.strategy
    assert winner.ep > 1
    assert f"Expert parallelism (ep={winner.ep}" in r.explanation
    assert "against the best candidate without it" in r.explanation
