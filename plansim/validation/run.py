"""``plansim validate``: measure real training steps (``train``, needs torch), predict the same configurations
(``predict``), and set them side by side (``compare``). Measuring and comparing are separate steps so that the
measurements of a GPU machine (``measured.csv``) can be compared again anywhere, without torch, for example after
a new kernel profile: ``repredict``, and ``compare_saved`` for a folder ``validate`` wrote. The node type is checked
before any step is measured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from plansim.errors import PlansimError
from plansim.hardware import Cluster
from plansim.validation.compare import validation_frame
from plansim.validation.points import ValidationPoint
from plansim.validation.predict import predict_point
from plansim.workload import ModelSpec
from plansim.workload.families import FAMILIES

__all__ = [
    "MODEL_COLUMNS",
    "compare_saved",
    "default_folder",
    "measure",
    "repredict",
    "resolve_hardware",
    "validate",
]

#: The model fields a measured row carries, so that it can be predicted again without the point objects.
MODEL_COLUMNS = ("model", "family", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len")
_SPEC_FIELDS = {"model": "name"}


def _model_fields(spec: ModelSpec) -> dict[str, Any]:
    data = spec.model_dump()
    return {column: data[_SPEC_FIELDS.get(column, column)] for column in MODEL_COLUMNS} | {
        "tied_embeddings": spec.tied_embeddings,
        "learned_positions": spec.learned_positions,
    }


def measure(
    points: Sequence[ValidationPoint],
    *,
    device: str,
    dtype: str = "bf16",
    warmup: int = 3,
    repeats: int = 10,
    progress: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Real steps of every point: one row each with the model fields, micro-batch, remat, the measured step time
    (median, min, max), peak memory and the last loss."""
    from plansim.validation.train import measure_point

    rows = []
    for point in points:
        if progress:
            progress(point.label)
        m = measure_point(point, device=device, dtype=dtype, warmup=warmup, repeats=repeats)
        rows.append(
            {
                "config": point.label,
                **_model_fields(point.model),
                "micro_batch": point.micro_batch,
                "remat": point.remat,
                "dtype": dtype,
                "measured_step_time_s": m.step_time_s,
                "measured_step_time_min_s": m.step_time_min_s,
                "measured_step_time_max_s": m.step_time_max_s,
                "measured_peak_memory_bytes": m.peak_memory_bytes,
                "loss": m.loss,
                "repeats": m.repeats,
            }
        )
    return pd.DataFrame(rows)


def _uses(family: Any, key: str) -> bool:
    """Whether a measured row's ``family`` reads ``key`` (an unknown family: no; ``ModelSpec`` then says why)."""
    entry = FAMILIES.get(family) if isinstance(family, str) else None
    return entry is not None and entry.uses(key)


def _point(row: Any) -> ValidationPoint:
    spec = ModelSpec(
        name=row.model,
        family=row.family,
        layers=int(row.layers),
        hidden=int(row.hidden),
        heads=int(row.heads),
        kv_heads=int(row.kv_heads),
        ffn_hidden=int(row.ffn_hidden),
        vocab=int(row.vocab),
        seq_len=int(row.seq_len),
        tied_embeddings=bool(row.tied_embeddings),
        **({"learned_positions": bool(row.learned_positions)} if _uses(row.family, "learned_positions") else {}),
    )
    return ValidationPoint(spec, int(row.micro_batch), str(row.remat))


def repredict(measured: pd.DataFrame, cluster: Cluster, *, engine: str = "analytic") -> pd.DataFrame:
    """The validation frame: each measured row with plansim's prediction on one GPU of ``cluster``'s type beside it
    (``predicted_*`` columns, the workspace reserve left out of the peak, the kernel-cost source) and the errors."""
    missing = [c for c in (*MODEL_COLUMNS, "micro_batch", "remat", "dtype") if c not in measured.columns]
    if missing:
        raise PlansimError(
            f"measurements lack the columns {', '.join(missing)}: use a measured.csv that validate wrote"
        )
    rows = []
    for row in measured.itertuples(index=False):
        prediction = predict_point(_point(row), cluster, dtype=str(row.dtype), engine=engine)
        rows.append(
            {
                **row._asdict(),
                "hardware": cluster.node.name,
                "predicted_step_time_s": prediction.step_time_s,
                "predicted_peak_memory_bytes": prediction.peak_memory_bytes,
                "predicted_workspace_bytes": prediction.workspace_bytes,
                "predicted_activation_bytes": prediction.memory_breakdown_bytes.get("activations", 0),
                "cost_model": prediction.cost_model,
                "engine": engine,
            }
        )
    return validation_frame(rows)


def default_folder(device: str) -> str:
    """``validation/<gpu>`` for a CUDA device with a shipped GPU profile (``validation/h100-sxm5-80gb``), else
    ``validation/cpu`` (or ``validation/cuda`` for an unknown GPU)."""
    from plansim.hardware.devices import device_profile

    if not device.startswith("cuda"):
        return "validation/cpu"
    import torch

    known = device_profile(torch.cuda.get_device_name(torch.device(device)))
    return f"validation/{known[0] if known else 'cuda'}"


#: The node type a CPU run is predicted for unless ``--hardware`` names one: the CLI's default elsewhere (``plan``,
#: ``simulate``, ``compare``), since no shipped profile describes a CPU.
DEFAULT_HARDWARE = "dgx-a100"


def resolve_hardware(device: str, hardware: str | None) -> str:
    """The node type to predict for, checked before any step runs: ``hardware``, or on a CUDA device the shipped
    node holding its GPU (``hardware.devices``), or on a CPU ``DEFAULT_HARDWARE`` (``plansim plan``'s default)."""
    from plansim.hardware import load_hardware
    from plansim.hardware.devices import device_profile

    if hardware is None and device.startswith("cuda"):
        import torch

        name = torch.cuda.get_device_name(torch.device(device))
        known = device_profile(name)
        if known is None:
            raise PlansimError(f"no shipped GPU profile matches the device {name!r}: pass --hardware NODE")
        hardware = known[1]
    if hardware is None:
        hardware = DEFAULT_HARDWARE
    load_hardware(hardware, gpus=1)  # an unknown name fails here
    return hardware


def validate(
    points: Sequence[ValidationPoint],
    out: Any,
    *,
    device: str,
    hardware: str | None = None,
    dtype: str = "bf16",
    warmup: int = 3,
    repeats: int = 10,
    engine: str = "analytic",
    command: str = "plansim validate",
    progress: Callable[[str], None] | None = None,
) -> tuple[pd.DataFrame, Any, list[Any]]:
    """Measure ``points`` on ``device``, write ``measured.csv`` and ``environment.json`` into ``out``, then compare
    (``compare_saved``). ``hardware`` (a node type) defaults to the one holding the device's GPU."""
    import json

    import torch

    from plansim.files.outputs import output_folder, staged_folder
    from plansim.profiling.profiler import environment

    folder = output_folder(out)
    env = environment(torch.device(device), command).model_dump(mode="json")
    node = resolve_hardware(device, hardware)
    measured = measure(points, device=device, dtype=dtype, warmup=warmup, repeats=repeats, progress=progress)
    context = {"device_name": env["device_name"], "command": command, "environment": env, "hardware": node}
    with staged_folder(folder) as stage:
        measured.to_csv(stage.path / "measured.csv", index=False)
        (stage.path / "environment.json").write_text(json.dumps(context, indent=2) + "\n", encoding="utf-8")
    return compare_saved(folder, engine=engine)


def compare_saved(
    folder: Any, *, out: Any = None, hardware: str | None = None, engine: str = "analytic"
) -> tuple[pd.DataFrame, Any, list[Any]]:
    """Predict the measurements in ``folder`` (``measured.csv`` and ``environment.json``, as ``validate`` wrote them)
    and write the report into ``out`` (default: ``folder``, beside the measurements, which are never rewritten): the
    frame, the summary and the files written. A separate ``out`` gets copies of the two measurement files too, so
    that it can be compared again (``--from OUT``)."""
    import io
    import os
    from pathlib import Path

    from plansim.errors import shown, shown_path
    from plansim.files.outputs import check_output_folder
    from plansim.files.yamlfile import parse_json, read_text
    from plansim.hardware import load_hardware
    from plansim.validation.compare import summarize
    from plansim.validation.report import write_report

    folder = Path(folder)
    target = folder if out is None else Path(out)
    check_output_folder(target)  # before any prediction
    measured_text = read_text(folder / "measured.csv", "measurements", "run validate first")
    try:
        measured = pd.read_csv(io.StringIO(measured_text))
    except (OSError, ValueError) as err:
        raise PlansimError(
            f"{shown_path(folder)}: no readable measured.csv ({shown(str(err), 80)}): run validate first"
        ) from None
    environment_text = read_text(folder / "environment.json", "environment", "run validate first")
    context = parse_json(environment_text, shown_path(folder / "environment.json"))
    if not isinstance(context, dict):
        raise PlansimError(f"{shown_path(folder / 'environment.json')}: expected a JSON object of environment keys")
    node = hardware or context.get("hardware")
    if not node or not isinstance(node, str):
        raise PlansimError(f"{shown_path(folder / 'environment.json')} names no hardware: pass --hardware NODE")
    context["hardware"] = node
    frame = repredict(measured, load_hardware(node, gpus=1), engine=engine)
    summary = summarize(frame)
    try:
        elsewhere = not os.path.samefile(folder, target)
    except OSError:  # the output folder does not exist yet
        elsewhere = True
    copies = {"measured.csv": measured_text, "environment.json": environment_text} if elsewhere else {}
    return frame, summary, write_report(frame, summary, target, context, copies=copies)
