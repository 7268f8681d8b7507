"""Strategy parsing (inline, YAML, shipped files) and validation against a model and a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

import plansim
from plansim.errors import PlansimError
from plansim.hardware import load_hardware
from plansim.strategy.checks import check_strategy
from plansim.strategy.schema import Strategy, list_strategies, load_strategy
from plansim.workload import load_model


def test_inline_and_yaml_agree(tmp_path: Path) -> None:
    inline = Strategy.parse(
        "dp=16,tp=8,pp=8,sequence_parallel=true,zero=1,micro_batch=1,global_batch=1536,"
        "schedule=interleaved,virtual_stages=2,remat=selective,attention=unfused,dtype=bf16,fp32_grad_accum=true"
    )
    assert load_strategy("megatron-3d") == inline
    path = tmp_path / "s.yaml"
    path.write_text(
        "dp: 16\ntp: 8\npp: 8\nsequence_parallel: true\nzero: 1\nmicro_batch: 1\nglobal_batch: 1536\n"
        "schedule: interleaved\nvirtual_stages: 2\nremat: selective\nattention: unfused\ndtype: bf16\n"
        "fp32_grad_accum: true\n"
    )
    assert Strategy.parse(str(path)) == inline


def test_every_shipped_strategy_loads() -> None:
    names = list_strategies()
    assert "megatron-3d" in names and len(names) >= 3
    for name in names:
        assert isinstance(load_strategy(name), Strategy)


def test_defaults_and_derived_dp() -> None:
    s = Strategy.parse("tp=2,pp=2").with_gpus(16)
    assert (s.dp, s.zero, s.schedule, s.remat, s.dtype, s.dp_algorithm) == (
        4,
        0,
        "1f1b",
        "none",
        None,
        "nccl",
    )  # NCCL_ALGO unset, as frameworks run it
    assert s.resolve(load_hardware("dgx-a100", gpus=16)).dtype == "bf16"
    assert Strategy.parse("dp=8").resolve(load_hardware("dgx-1", gpus=8)).dtype == "fp16"
    assert s.num_microbatches == 1
    with pytest.raises(PlansimError, match="multiple of tp\\*cp\\*pp"):
        Strategy.parse("tp=3").with_gpus(8)


def test_valid_megatron_175b_has_no_problems() -> None:
    cluster = load_hardware("dgx-a100", gpus=1024)
    assert check_strategy(load_strategy("megatron-3d"), load_model("gpt3-175b"), cluster) == []


def test_every_violation_is_reported_at_once() -> None:
    cluster = load_hardware("dgx-a100", gpus=8)
    s = Strategy.parse("dp=3,tp=5,pp=2,zero=3,global_batch=7")
    problems = check_strategy(s, load_model("gpt3-125m"), cluster)
    text = " | ".join(problems)
    for words in ("dp*tp*cp*pp", "heads=12", "zero=3", "global_batch=7"):
        assert words in text
    assert len(problems) == 4


def test_exponent_numbers_read_as_in_hardware_profiles(tmp_path: Path) -> None:
    # One YAML reader for every data file: 25e6 is a number in a strategy as it is in a hardware profile.
    assert Strategy.parse("dp=8,grad_bucket_bytes=25e6").grad_bucket_bytes == 25_000_000
    path = tmp_path / "s.yaml"
    path.write_text("dp: 8\ngrad_bucket_bytes: 4e7\n")
    assert load_strategy(path).grad_bucket_bytes == 40_000_000


@pytest.mark.parametrize(
    "loader",
    [load_strategy, load_model, load_hardware],
    ids=["strategy", "model", "hardware"],
)
def test_every_loader_reports_malformed_yaml_alike(loader, tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("a: [1, 2\n")
    with pytest.raises(PlansimError, match=r"broken.yaml: malformed YAML at line \d+: .*: fix the syntax"):
        loader(path)


def test_api_takes_a_mapping_of_fields() -> None:
    import plansim

    r = plansim.simulate("gpt3-125m", "dgx-a100", {"dp": 8, "zero": 1, "global_batch": 16})
    assert r.strategy["zero"] == 1 and r.num_microbatches == 2
    with pytest.raises(PlansimError, match="field 'zeroo'"):
        plansim.simulate("gpt3-125m", "dgx-a100", {"dp": 8, "zeroo": 1})


def test_zb_h1_runs_one_chunk_per_stage() -> None:
    cluster = load_hardware("dgx-a100", gpus=8)
    model = load_model("gpt3-125m")
    for pp in (1, 4):  # pp=1: nothing to pipeline, the same as 1F1B
        s = Strategy.parse(f"dp={8 // pp},pp={pp},global_batch=64,schedule=zb-h1,framework=fsdp")
        assert check_strategy(s, model, cluster) == []
    with pytest.raises(PlansimError, match=r"zb-h1 runs one model chunk per stage.*virtual_stages=1"):
        Strategy.parse("pp=4,schedule=zb-h1,virtual_stages=2")


REGISTRIES = [
    ("schedule", "plansim.pipeline.schedules", "SCHEDULES"),
    ("dp_algorithm", "plansim.costs.collectives", "ALLREDUCE_ALGORITHMS"),
    ("remat", "plansim.costs.remat_policies", "REMAT_POLICIES"),
]


@pytest.mark.parametrize(("field", "module", "name"), REGISTRIES)
def test_strategy_names_come_from_the_registries(field: str, module: str, name: str) -> None:
    """Every registered name is a valid value; any other is refused in one line that lists the registry."""
    import importlib

    registry = getattr(importlib.import_module(module), name)
    for key in registry:
        extra = {"schedule": "interleaved", "virtual_stages": 2} if key == "interleaved" else {}
        assert getattr(Strategy(**{field: key, **extra}), field) == key
    with pytest.raises(PlansimError) as err:
        Strategy.parse(f"{field}=bogus")
    assert "\n" not in str(err.value)
    assert f"{field}='bogus' is unknown: choose one of {', '.join(registry)}" in str(err.value)


def test_a_new_registry_entry_is_a_valid_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding an all-reduce algorithm is one registry entry: the strategy accepts it, with no list to edit."""
    from plansim.costs.collectives import ALLREDUCE_ALGORITHMS, Algorithm

    with pytest.raises(PlansimError):
        Strategy.parse("dp_algorithm=ring2")
    monkeypatch.setitem(ALLREDUCE_ALGORITHMS, "ring2", Algorithm(ALLREDUCE_ALGORITHMS["ring"].build))
    assert Strategy.parse("dp_algorithm=ring2").dp_algorithm == "ring2"


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_interleaved_without_global_batch_is_refused_in_one_line(engine: str) -> None:
    """Without global_batch a step runs one micro-batch, which the interleaved schedule cannot split over pp > 1
    stages: a one-line error naming the fix, in both engines (the DES used to raise a bare ValueError)."""
    with pytest.raises(PlansimError, match=r"set global_batch=8$"):
        plansim.simulate(
            "gpt3-350m", "dgx-a100", "dp=2,pp=4,schedule=interleaved,virtual_stages=2,micro_batch=1", gpus=8,
            engine=engine,
        )  # fmt: skip


# ---- expert parallelism's fields --------------------------------------------------------------------------------


def test_a_dense_strategy_dumps_without_the_expert_fields() -> None:
    """ep 1 and etp unset are left out of the dump (every stored result keeps its keys); set, they are written and
    read back."""
    dense = Strategy(dp=8, tp=2, pp=2)
    assert "ep" not in dense.model_dump() and "etp" not in dense.model_dump()
    assert "ep" not in dense.model_dump(mode="json")
    moe = Strategy(dp=8, tp=2, ep=4, etp=1)
    assert (moe.model_dump()["ep"], moe.model_dump()["etp"]) == (4, 1)
    assert Strategy.model_validate(moe.model_dump()) == moe
    assert Strategy.parse("dp=8,tp=2,ep=4,etp=1") == moe


@pytest.mark.parametrize("text", ["dp=8,ep=0", "dp=8,etp=0", "dp=8,ep=true", "dp=8,ep=2097152"])
def test_expert_degrees_out_of_range_are_one_line(text: str) -> None:
    with pytest.raises(PlansimError) as err:
        Strategy.parse(text)
    name = text.split(",")[1].split("=")[0]
    assert "\n" not in str(err.value) and f"'{name}'" in str(err.value)


def test_expert_fields_on_a_model_without_experts_are_refused_in_one_line() -> None:
    """Megatron-LM: "num_experts must be non None to use expert model parallelism" (arguments.py:1655-1656)."""
    model, cluster = load_model("gpt3-1.3b"), load_hardware("dgx-a100", gpus=16)
    (problem,) = check_strategy(Strategy(tp=2, dp=8, ep=2, etp=1), model, cluster)
    assert problem == (
        "ep=2 and etp=1 on model 'gpt3-1.3b', which has no experts: leave ep and etp out (they split a "
        "mixture-of-experts model's experts)"
    )
    assert check_strategy(Strategy(tp=2, dp=8, etp=2), model, cluster) == []  # etp = tp: the default, said


def test_ep_must_divide_the_experts() -> None:
    """Megatron-LM: "Number of experts should be a multiple of expert model parallel_size" (arguments.py:1657-1658)."""

    class Moe:
        name, experts = "moe", 6

    from plansim.strategy.checks import expert_problems

    (problem,) = expert_problems(Strategy(dp=16, ep=4), Moe())  # type: ignore[arg-type]
    assert problem == "ep=4 must divide the model's 6 experts: use ep in 1, 2, 3, 6"
    assert expert_problems(Strategy(dp=16, ep=2), Moe()) == []  # type: ignore[arg-type]
