"""plansim's prediction for a validation point: one device (dp = tp = pp = 1), one micro-batch per step, the
point's remat policy, priced with the measured kernel profile of the GPU when one is committed.

What is compared with ``torch.cuda.max_memory_allocated`` is the peak of live tensors: plansim's peak memory less
what that counter does not see (``NOT_ALLOCATED``): the GPU profile's workspace reserve (transients plansim does not
model op by op), the CUDA context, NCCL's buffers (none on one device) and the caching allocator's rounding
(``fragmentation``: reserved, not allocated). They are reported beside it (``workspace_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.api import simulate
from plansim.hardware import Cluster
from plansim.strategy.schema import Strategy
from plansim.validation.points import ValidationPoint

__all__ = ["NOT_ALLOCATED", "Prediction", "predict_point"]

#: Memory categories of a Result that ``torch.cuda.max_memory_allocated`` does not count.
NOT_ALLOCATED = ("workspace", "cuda_context", "nccl", "userbuffers", "fragmentation")


@dataclass(frozen=True)
class Prediction:
    """plansim's step time, peak tensor bytes (peak less ``NOT_ALLOCATED``), those left-out bytes
    (``workspace_bytes``), and where the kernel costs came from."""

    step_time_s: float
    peak_memory_bytes: int
    workspace_bytes: int
    memory_breakdown_bytes: dict[str, int]
    cost_model: str
    engine: str


def predict_point(
    point: ValidationPoint, cluster: Cluster, *, dtype: str = "bf16", engine: str = "analytic"
) -> Prediction:
    """Simulate ``point`` on one GPU of ``cluster``'s type."""
    from plansim.hardware.loader import resize

    strategy = Strategy(
        dp=1,
        tp=1,
        pp=1,
        micro_batch=point.micro_batch,
        global_batch=point.micro_batch,
        remat=point.remat,
        dtype=dtype,
        attention="unfused",  # the validator's torch models write the attention core out (profiling/torch_models.py)
    )
    result = simulate(point.model, resize(cluster, 1), strategy, engine=engine)
    workspace = sum(int(result.memory_breakdown_bytes.get(k, 0)) for k in NOT_ALLOCATED)
    return Prediction(
        step_time_s=result.step_time_s,
        peak_memory_bytes=int(result.peak_memory_bytes) - workspace,
        workspace_bytes=workspace,
        memory_breakdown_bytes=dict(result.memory_breakdown_bytes),
        cost_model=result.cost_model,
        engine=engine,
    )
