"""The model-family registry (``plansim.workload.families``): each shipped family's entry reproduces the rules that
were written out per family before it (keys, tensor-parallel split, transformer-only options, Hugging Face types,
the validator's torch block), and a family registered at runtime is read by every reader: ``ModelSpec``,
``build_graph``, ``check_strategy``, the planner's search space and the Hugging Face importer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from plansim.errors import PlansimError
from plansim.files.yamlfile import validated
from plansim.hardware import load_hardware
from plansim.planner import planning
from plansim.planner.space import candidates, count_candidates
from plansim.strategy.checks import check_strategy
from plansim.strategy.mesh import AXIS_ORDER
from plansim.strategy.schema import Strategy
from plansim.workload import ModelSpec, build_graph, from_hf_config, graph_totals, list_models, load_model
from plansim.workload.families import (
    FAMILIES,
    UNUSED,
    Family,
    HFFamily,
    ModelShape,
    axis_problems,
    hf_model_types,
)
from plansim.workload.mlp import add_mlp, mlp_parameters

# --- the shipped families reproduce the rules written out per family before the registry ---------------------

#: Per optional key, per family: required, a default (its value for a model with hidden=64, heads=4 and no other
#: optional key), or refused. The table of the former ``spec._FAMILY_RULES``.
REQ, NO = "required", "refused"
KEY_RULES = {
    "heads": {"gpt": REQ, "llama": REQ, "mlp": NO, "cnn": NO, "moe": REQ},
    "kv_heads": {"gpt": 4, "llama": 4, "mlp": NO, "cnn": NO, "moe": 4},
    "head_dim": {"gpt": 16, "llama": 16, "mlp": NO, "cnn": NO, "moe": 16},
    "ffn_hidden": {"gpt": 256, "llama": REQ, "mlp": 256, "cnn": NO, "moe": REQ},
    "seq_len": {"gpt": REQ, "llama": REQ, "mlp": 1, "cnn": NO, "moe": REQ},
    "tied_embeddings": {"gpt": True, "llama": False, "mlp": NO, "cnn": NO, "moe": False},
    "learned_positions": {"gpt": True, "llama": NO, "mlp": NO, "cnn": NO, "moe": NO},
    "image_size": {"gpt": NO, "llama": NO, "mlp": NO, "cnn": 224, "moe": NO},
    "stage_blocks": {"gpt": NO, "llama": NO, "mlp": NO, "cnn": (3, 4, 6, 3), "moe": NO},
}
#: The ``moe`` family's own keys: the other families refuse them all.
MOE_KEYS = {"experts": REQ, "experts_per_token": REQ, "expert_ffn_hidden": REQ, "shared_ffn_hidden": 0,
            "dense_layers": 0, "capacity_factor": 0.0, "q_lora_rank": 0, "kv_lora_rank": 0, "rope_head_dim": 0,
            "v_head_dim": None, "moe_imbalance": 1.0}  # fmt: skip
KEY_RULES.update({key: {"gpt": NO, "llama": NO, "mlp": NO, "cnn": NO, "moe": rule} for key, rule in MOE_KEYS.items()})


def test_the_registry_lists_the_shipped_families_in_order() -> None:
    assert list(FAMILIES) == ["gpt", "llama", "moe", "mlp", "cnn"]
    assert all(entry.name == name for name, entry in FAMILIES.items())
    assert [row["family"] for row in list_models()] == sorted(
        (row["family"] for row in list_models()), key=list(FAMILIES).index
    )
    assert set(KEY_RULES) == set(UNUSED)


@pytest.mark.parametrize("family", ["gpt", "llama", "mlp", "cnn", "moe"])
def test_key_rules_are_the_former_table(family: str) -> None:
    entry = FAMILIES[family]
    data = {"hidden": 64, "heads": 4}
    for key, rule in KEY_RULES.items():
        if rule[family] == REQ:
            assert key in entry.required and entry.uses(key), key
        elif rule[family] == NO:
            assert not entry.uses(key), key
        else:
            default = entry.defaults[key](data)
            assert key not in entry.required and default == rule[family], key


@pytest.mark.parametrize("family", ["gpt", "llama", "mlp", "cnn", "moe"])
def test_key_rules_are_enforced_with_the_same_messages(family: str) -> None:
    base = {"name": "x", "family": family, "layers": 16, "hidden": 64, "vocab": 10}
    given = {"heads": 4, "kv_heads": 2, "ffn_hidden": 96, "seq_len": 8, "tied_embeddings": True,
             "learned_positions": False, "image_size": 64, "stage_blocks": [3, 4, 6, 3], "head_dim": 16,
             "experts": 4, "experts_per_token": 2, "expert_ffn_hidden": 32, "shared_ffn_hidden": 32,
             "dense_layers": 1, "capacity_factor": 1.25, "q_lora_rank": 8, "kv_lora_rank": 8, "rope_head_dim": 4,
             "v_head_dim": 16, "moe_imbalance": 1.3}  # fmt: skip
    needed = {k: given[k] for k, rule in KEY_RULES.items() if rule[family] == REQ}
    validated(ModelSpec, {**base, **needed}, "m.yaml")
    for key, rule in KEY_RULES.items():
        if rule[family] == REQ:
            with pytest.raises(PlansimError, match=f"{family} models need '{key}': add it"):
                validated(ModelSpec, {**base, **{k: v for k, v in needed.items() if k != key}}, "m.yaml")
        elif rule[family] == NO:
            with pytest.raises(PlansimError, match=f"{family} models do not use '{key}': remove it"):
                validated(ModelSpec, {**base, **needed, key: given[key]}, "m.yaml")


def test_unknown_family_message_is_pydantics_literal_one() -> None:
    with pytest.raises(PlansimError, match=r"field 'family': Input should be 'gpt', 'llama', 'moe', 'mlp' or 'cnn'$"):
        validated(ModelSpec, {"name": "x", "family": "rnn", "layers": 2, "hidden": 8, "vocab": 2}, "m.yaml")


def test_tp_rules_are_the_former_ones() -> None:
    gpt, llama, mlp, cnn = (load_model(n) for n in ("gpt3-175b", "llama3-8b", "mlp-small", "resnet50"))
    assert axis_problems(gpt, "tp", 8) == []
    assert axis_problems(gpt, "tp", 5) == ["tp=5 does not divide heads=96: choose tp among the divisors of the heads"]
    assert axis_problems(llama, "tp", 8) == []
    assert axis_problems(llama, "tp", 16) == ["tp=16 does not divide kv_heads=8: use tp <= 8"]
    assert axis_problems(llama, "tp", 3) == ["tp=3 does not divide heads=32: choose tp among the divisors of the heads"]
    assert axis_problems(mlp, "tp", 8) == axis_problems(mlp, "tp", 3) == []
    assert axis_problems(cnn, "tp", 1) == []
    assert axis_problems(cnn, "tp", 2) == ["tp=2: cnn models support tp=1 only: use dp or pp"]
    for model in (gpt, llama, mlp, cnn):
        assert axis_problems(model, "pp", 7) == axis_problems(model, "dp", 7) == []


def test_entry_properties_are_the_former_ones() -> None:
    assert {n for n, f in FAMILIES.items() if f.transformer} == {"gpt", "llama", "moe"}
    assert {n: f.torch_model for n, f in FAMILIES.items()} == {"gpt": "gpt", "llama": "llama", "moe": None,
                                                                "mlp": None, "cnn": None}  # fmt: skip
    assert {t: f.name for t, (f, _) in hf_model_types().items()} == {
        "gpt2": "gpt", "gpt_neox": "gpt", "llama": "llama", "mistral": "llama", "qwen2": "llama",
        "mixtral": "moe", "qwen2_moe": "moe", "qwen3_moe": "moe", "deepseek_v3": "moe"}  # fmt: skip
    assert all(set(f.axis_rules) <= set(AXIS_ORDER) for f in FAMILIES.values())


def test_a_bad_entry_is_refused() -> None:
    with pytest.raises(PlansimError, match="family toy: colour are not optional ModelSpec keys"):
        Family("toy", add_mlp, mlp_parameters, required=("colour",))
    with pytest.raises(PlansimError, match="family toy: seq_len both required and defaulted: keep one"):
        Family("toy", add_mlp, mlp_parameters, required=("seq_len",), defaults={"seq_len": lambda d: 1})


# --- a family registered at runtime is read everywhere -----------------------------------------------------------


def _toy_tp(model: ModelShape, tp: int) -> list[str]:
    """The toy's rule: tp divides hidden/64."""
    return [] if (model.hidden // 64) % tp == 0 else [f"tp={tp} does not divide hidden/64={model.hidden // 64}"]


_TOY_KEYS = {"layers": "num_layers", "hidden": "hidden_size", "ffn_hidden": "intermediate_size", "vocab": "num_labels"}
TOY = Family(
    "toy",
    add_mlp,
    mlp_parameters,
    defaults={"ffn_hidden": lambda d: 4 * d["hidden"], "seq_len": lambda d: 1},
    axis_rules={"tp": _toy_tp},
    hf_model_types={"toy_mlp": HFFamily(_TOY_KEYS, tied=False, learned_positions=False, optional=("ffn_hidden",))},
)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelSpec]:
    """The toy family registered for one test (removed after it), and a model of it: hidden 128, so tp in {1, 2}."""
    monkeypatch.setitem(FAMILIES, "toy", TOY)
    yield ModelSpec(name="toy", family="toy", layers=4, hidden=128, vocab=10)


def test_a_toy_family_is_refused_unless_registered() -> None:
    with pytest.raises(PlansimError, match="Input should be 'gpt', 'llama', 'moe', 'mlp' or 'cnn'"):
        validated(ModelSpec, {"name": "x", "family": "toy", "layers": 2, "hidden": 128, "vocab": 2}, "m.yaml")


def test_a_registered_family_is_a_model(toy: ModelSpec) -> None:
    assert (toy.ffn_hidden, toy.seq_len, toy.heads) == (512, 1, 0)
    assert toy.num_parameters() == 4 * (2 * 128 * 512 + 512 + 128) + 128 * 10 + 10
    assert toy.file_fields() == {"name": "toy", "family": "toy", "layers": 4, "hidden": 128, "ffn_hidden": 512,
                                 "vocab": 10, "seq_len": 1}  # fmt: skip
    assert graph_totals(build_graph(toy, 2))["params"] == toy.num_parameters()
    with pytest.raises(PlansimError, match="toy models do not use 'heads': remove it"):
        validated(ModelSpec, {**toy.file_fields(), "heads": 4}, "m.yaml")
    with pytest.raises(PlansimError, match=r"'family': Input should be 'gpt', 'llama', 'moe', 'mlp', 'cnn' or 'toy'"):
        validated(ModelSpec, {**toy.file_fields(), "family": "rnn"}, "m.yaml")


def test_check_strategy_refuses_what_the_toy_rule_refuses(toy: ModelSpec) -> None:
    cluster = load_hardware("dgx-a100", gpus=8)
    assert check_strategy(Strategy.parse("tp=2"), toy, cluster) == []
    assert check_strategy(Strategy.parse("tp=4"), toy, cluster) == ["tp=4 does not divide hidden/64=2"]
    overlap = check_strategy(Strategy.parse("tp=2,sequence_parallel=true,tp_comm_overlap=true"), toy, cluster)
    assert overlap == [
        "tp_comm_overlap=true with a toy model: Megatron-LM overlaps only transformer blocks' GEMMs: "
        "leave tp_comm_overlap out"
    ]


def test_the_planner_space_leaves_out_the_toy_rules_degrees(toy: ModelSpec) -> None:
    cluster = load_hardware("dgx-a100", gpus=8)
    found = list(candidates(toy, cluster, 16))
    assert {s.tp for s in found} == {1, 2}
    assert not any(s.tp_comm_overlap for s in found)
    assert count_candidates(toy, cluster, 16) == len(found)
    assert planning._megatron_tp(toy, cluster) == 2


def test_the_importer_maps_the_toy_model_type(toy: ModelSpec, tmp_path: Path) -> None:
    config = {"model_type": "toy_mlp", "num_layers": 4, "hidden_size": 128, "num_labels": 10}
    assert from_hf_config(config, name="toy") == toy
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "intermediate_size": 256}))
    spec = from_hf_config(tmp_path)
    assert (spec.family, spec.ffn_hidden, spec.name) == ("toy", 256, tmp_path.name)
    with pytest.raises(PlansimError, match=r"plansim reads gpt2, gpt_neox, llama, mistral, qwen2, mixtral, .*toy_mlp"):
        from_hf_config({**config, "model_type": "t5"})
