"""A reference set of results, to check that a change of structure changes no figure.

Every collective algorithm, ZeRO stage, schedule x remat policy, framework (hybrid sharding included), the
discrete-event what-ifs, a GPT, a Llama with grouped-query attention, an MLP and a CNN, each through both engines,
and one planner ranking. ``--write`` stores them in ``tests/data/reference_results.json``; ``tests/
test_reference_results.py`` recomputes them and compares every number within 1e-12 relative.

    python scripts/reference_results.py --write
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REFERENCE = Path(__file__).resolve().parents[1] / "tests" / "data" / "reference_results.json"

#: A Llama small enough to run everywhere: grouped-query attention (8 heads, 2 kv heads), SwiGLU, RMSNorm.
TINY_LLAMA = {
    "name": "tiny-llama",
    "family": "llama",
    "layers": 4,
    "hidden": 512,
    "heads": 8,
    "kv_heads": 2,
    "ffn_hidden": 1408,
    "vocab": 32000,
    "seq_len": 1024,
}

GPT = "gpt3-125m"
BASE = "micro_batch=2,global_batch=32"


def cases() -> Iterator[tuple[str, Any, str, int, str, dict[str, Any]]]:
    """(label, model, hardware, gpus, strategy, DES options), every one run through both engines."""
    from plansim.costs.collectives import ALLREDUCE_ALGORITHMS
    from plansim.costs.remat_policies import REMAT_POLICIES
    from plansim.pipeline.schedules import SCHEDULES

    for algorithm in ALLREDUCE_ALGORITHMS:
        yield f"collective {algorithm}", GPT, "dgx-a100", 16, f"dp=16,{BASE},dp_algorithm={algorithm}", {}
    for zero in range(4):
        yield f"zero {zero}", GPT, "dgx-a100", 16, f"dp=8,tp=2,{BASE},zero={zero}", {}
    for schedule in SCHEDULES:
        for remat in REMAT_POLICIES:
            if remat == "milp" and schedule not in ("1f1b", "interleaved"):
                continue
            extra = ",virtual_stages=3" if schedule == "interleaved" else ""
            extra += "" if schedule in ("1f1b", "interleaved") else ",framework=fsdp"  # torch's pipelining runs these
            strategy = f"dp=2,tp=2,pp=4,micro_batch=1,global_batch=16,schedule={schedule},remat={remat}{extra}"
            yield f"schedule {schedule} remat {remat}", GPT, "dgx-a100", 16, strategy, {}
    frameworks = {
        "megatron": "dp=4,tp=2,pp=2,sequence_parallel=true,zero=1,micro_batch=1,global_batch=16,tp_comm_overlap=true",
        "deepspeed": "dp=8,tp=2,zero=3,micro_batch=2,global_batch=32",
        "fsdp": "dp=16,zero=3,micro_batch=2,global_batch=32",
        "fsdp hybrid": "dp=16,dp_shard=8,zero=3,micro_batch=2,global_batch=32",
        "fsdp zero2": "dp=16,zero=2,micro_batch=2,global_batch=32",
    }
    for label, strategy in frameworks.items():
        framework = label.split()[0]
        yield f"framework {label}", GPT, "dgx-h100", 16, f"{strategy},framework={framework}", {}
    yield "llama gqa", dict(TINY_LLAMA), "dgx-h100", 16, "dp=2,tp=2,pp=4,micro_batch=1,global_batch=16", {}
    yield "llama sp zero3", dict(TINY_LLAMA), "dgx-a100", 8, "dp=4,tp=2,sequence_parallel=true,zero=3,micro_batch=2", {}
    # context parallelism: the ring across two nodes (cp's stride is tp = 4), the all-to-all within one
    strategy = f"dp=2,tp=4,cp=4,sequence_parallel=true,zero=1,cp_algorithm=ring,{BASE}"
    yield "context parallel ring", GPT, "dgx-a100", 32, strategy, {}
    strategy = f"dp=4,tp=2,cp=2,pp=2,sequence_parallel=true,zero=1,cp_algorithm=all_to_all,{BASE}"
    yield "context parallel all_to_all", GPT, "dgx-a100", 32, strategy, {}
    # FP8: delayed scaling with sequence parallelism and pipelining; current scaling with FP8 parameter gather (fsdp)
    strategy = f"dp=4,tp=2,pp=2,sequence_parallel=true,zero=1,dtype=fp8,{BASE}"
    yield "fp8 delayed", GPT, "dgx-h100", 16, strategy, {}
    strategy = f"dp=16,zero=3,dtype=fp8,fp8_param_gather=true,framework=fsdp,{BASE}"
    yield "fp8 current fsdp", GPT, "dgx-h100", 16, strategy, {}
    # offloading: DeepSpeed's optimizer and parameters (ZeRO-Infinity), Megatron-LM's optimizer and activations
    strategy = f"dp=8,tp=2,zero=3,offload=optimizer/params,framework=deepspeed,{BASE}"
    yield "offload deepspeed", GPT, "dgx-h100", 16, strategy, {}
    strategy = f"dp=8,tp=2,zero=1,offload=optimizer/activations,offload_activation_layers=6,{BASE}"
    yield "offload megatron", GPT, "dgx-h100", 16, strategy, {}
    yield "mlp", "mlp-small", "pcie-4x4090", 4, "dp=2,pp=2,micro_batch=4,global_batch=32", {}
    yield "cnn", "resnet50", "dgx-1", 8, "dp=8,micro_batch=32", {}
    yield "gpt 2 nodes tied", GPT, "dgx-a100", 16, "dp=2,tp=4,pp=2,micro_batch=1,global_batch=16", {}
    what_ifs = {
        "straggler": {"stragglers": {3: 1.5}},
        "degraded link": {"link_factors": {"node0/nic0": 0.5}},
        "failed link": {"failed_links": ["node1/nic0"]},
        "jitter": {"jitter": 0.05, "seed": 7},
        "full mode": {"mode": "full"},
    }
    for label, options in what_ifs.items():
        yield f"what-if {label}", GPT, "dgx-a100", 16, f"dp=4,tp=2,pp=2,{BASE}", options


def _numbers(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf of a JSON value, keyed by its path."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _numbers(item, f"{prefix}[{i}]")
    else:
        yield prefix, value


def compute(progress: bool = False) -> dict[str, Any]:
    """label/engine -> flattened result; plus the planner's ranking."""
    from plansim import simulate
    from plansim.describe import describe
    from plansim.errors import PlansimError
    from plansim.planner import plan
    from plansim.workload import ModelSpec

    out: dict[str, Any] = {}
    for label, model, hardware, gpus, strategy, options in cases():
        spec = ModelSpec(**model) if isinstance(model, dict) else model
        for engine in ("analytic", "des"):
            given = options if engine == "des" else {}
            if engine == "analytic" and options:
                continue
            try:
                result = simulate(spec, hardware, strategy, gpus=gpus, engine=engine, **given)
            except PlansimError as error:  # a refusal is a result too: its words must not change either
                out[f"{label} / {engine}"] = {"refused": str(error)}
                if progress:
                    print(f"{label} / {engine}: refused: {error}", flush=True)
                continue
            out[f"{label} / {engine}"] = dict(_numbers(result.to_dict()))
            if progress:
                print(f"{label} / {engine}: {result.step_time_s:.6f} s", flush=True)
    for framework in ("megatron", "all"):
        found = plan(GPT, "dgx-a100", gpus=16, global_batch=64, top_k=5, constraints={"framework": framework})
        ranking = {f"{i} {describe(f.priced.strategy, framework=True)}": f.result.step_time_s
                   for i, f in enumerate(found.outcome.finalists)}  # fmt: skip
        ranking.update({f"rejected {reason}": n for reason, n in found.outcome.rejected.items()})
        ranking.update(candidates=found.outcome.candidates, fitting=found.outcome.fit_count)
        out[f"planner ranking {framework}"] = ranking
    return out


def differences(expected: dict[str, Any], got: dict[str, Any], rel: float = 1e-12) -> list[str]:
    """Each case and field whose value differs by more than ``rel`` (or is missing on one side)."""
    found = []
    for case in sorted(set(expected) | set(got)):
        want, have = expected.get(case), got.get(case)
        if want is None or have is None:
            found.append(f"{case}: only in {'the reference' if have is None else 'this run'}")
            continue
        for key in sorted(set(want) | set(have)):
            a, b = want.get(key, "<missing>"), have.get(key, "<missing>")
            if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
                if not math.isclose(a, b, rel_tol=rel, abs_tol=1e-300):
                    found.append(f"{case}: {key} {a!r} -> {b!r}")
            elif a != b:
                found.append(f"{case}: {key} {a!r} -> {b!r}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="store the results as the reference")
    args = parser.parse_args()
    got = compute(progress=True)
    if args.write:
        REFERENCE.write_text(json.dumps(got, indent=0, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote {REFERENCE} ({len(got)} cases)")
        return
    found = differences(json.loads(REFERENCE.read_text(encoding="utf-8")), got)
    print("\n".join(found) or f"all {len(got)} cases identical within 1e-12")
    raise SystemExit(1 if found else 0)


if __name__ == "__main__":
    main()
