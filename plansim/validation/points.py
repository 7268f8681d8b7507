"""The configurations the validator runs: a model (one that fits one device), a micro-batch size, a sequence length
and a rematerialization policy. ``default_points`` gives the grid ``plansim validate`` runs on a GPU (14 points:
four GPT/Llama sizes, micro-batches 1-8, sequences 512-2,048, remat none / selective / full) and the tiny grid it runs
on a CPU (the tests' and CI's).
"""

from __future__ import annotations

from dataclasses import dataclass

from plansim.workload import ModelSpec, load_model

__all__ = ["ValidationPoint", "default_points", "point"]


@dataclass(frozen=True)
class ValidationPoint:
    """One configuration: ``model`` (its ``seq_len`` is the sequence length), ``micro_batch`` sequences per step on
    one device, and the ``remat`` policy (none, selective or full)."""

    model: ModelSpec
    micro_batch: int
    remat: str

    @property
    def label(self) -> str:
        """``gpt3-125m s1024 b4 selective``."""
        return f"{self.model.name} s{self.model.seq_len} b{self.micro_batch} {self.remat}"


def point(
    model: str | ModelSpec, micro_batch: int, remat: str = "none", *, seq_len: int | None = None
) -> ValidationPoint:
    """A point on a preset or spec, with the sequence length changed if ``seq_len`` is given.

    >>> point("gpt3-125m", 4, "full", seq_len=1024).label
    'gpt3-125m s1024 b4 full'
    """
    spec = load_model(model) if isinstance(model, str) else model
    if seq_len is not None and seq_len != spec.seq_len:
        spec = spec.model_copy(update={"seq_len": seq_len})
    return ValidationPoint(spec, micro_batch, remat)


#: Models small enough for a CPU step in milliseconds.
_TINY_GPT = ModelSpec(name="tiny-gpt", family="gpt", layers=2, hidden=64, heads=4, seq_len=64, vocab=512)
_TINY_LLAMA = ModelSpec(
    name="tiny-llama", family="llama", layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=176, seq_len=64, vocab=512
)


#: A Llama 3 8B with 4 of its 32 blocks: its widths (4096, GQA 32/8 heads, SwiGLU 14,336, vocabulary 128,256) at a
#: size whose model states (16 bytes per parameter) fit an 80 GB GPU with room for activations.
_LLAMA_4L = load_model("llama3-8b").model_copy(update={"name": "llama3-8b-4l", "layers": 4})


def default_points(device: str = "cuda", quick: bool = False) -> list[ValidationPoint]:
    """The grid for ``device``: on ``cuda`` 14 points (``quick``: 4); on ``cpu`` 6 tiny ones (``quick``: 3)."""
    if device.startswith("cpu"):
        gpt, llama = _TINY_GPT, _TINY_LLAMA
        points = [
            point(gpt, 2, "none"),
            point(gpt, 4, "selective"),
            point(llama, 2, "full"),
            point(gpt, 2, "full", seq_len=128),
            point(llama, 4, "none", seq_len=32),
            point(llama, 2, "selective"),
        ]
        return points[:3] if quick else points
    points = [
        point("gpt3-125m", 8, "none", seq_len=1024),
        point("gpt3-125m", 4, "none", seq_len=2048),
        point("gpt3-125m", 8, "selective", seq_len=2048),
        point("gpt3-125m", 16, "full", seq_len=2048),
        point("gpt3-350m", 4, "none", seq_len=2048),
        point("gpt3-350m", 8, "selective", seq_len=1024),
        point("gpt3-350m", 8, "full", seq_len=2048),
        point("gpt3-1.3b", 1, "none", seq_len=2048),
        point("gpt3-1.3b", 2, "selective", seq_len=2048),
        point("gpt3-1.3b", 4, "full", seq_len=2048),
        point(_LLAMA_4L, 1, "none", seq_len=2048),
        point(_LLAMA_4L, 2, "selective", seq_len=4096),
        point(_LLAMA_4L, 4, "full", seq_len=2048),
        point("gpt3-2.7b", 1, "selective", seq_len=2048),
    ]
    return [points[i] for i in (0, 4, 8, 12)] if quick else points
