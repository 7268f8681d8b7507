"""The model schema (``ModelSpec``); ``plansim.workload.loader`` loads it from preset names, YAML files and
Hugging Face configs.

A model file holds one mapping with the keys below; unknown keys are rejected. Keys a family does not use are
rejected too, so a typo cannot silently change nothing.

========================  =====================================================================================
key                       meaning
========================  =====================================================================================
``name``                  model name (presets: the file's stem)
``family``                ``gpt`` (LayerNorm, GELU, learned positions, biases), ``llama`` (RMSNorm, SwiGLU,
                          rotary, grouped-query attention, no biases), ``mlp`` (residual GELU MLP blocks) or
                          ``cnn`` (ResNet with bottleneck blocks)
``layers``                transformer blocks; MLP blocks; for ``cnn`` the number of bottleneck blocks
``hidden``                model width h; for ``cnn`` the stem width (64 for ResNet-50)
``heads``                 attention heads a (``gpt``, ``llama`` only; must divide ``hidden``)
``kv_heads``              key/value heads for grouped-query attention (default ``heads``; must divide ``heads``)
``ffn_hidden``            feed-forward width (default ``4 * hidden`` for ``gpt`` and ``mlp``; required for
                          ``llama``, where it is the SwiGLU width)
``seq_len``               tokens per sequence s (required for ``gpt``, ``llama``; ``mlp``: samples per
                          sequence, default 1; not used by ``cnn``)
``vocab``                 vocabulary size V; for ``mlp`` and ``cnn`` the number of output classes
``tied_embeddings``       output head shares the input embedding (default true for ``gpt`` as in GPT-3,
                          false for ``llama``)
``learned_positions``     ``gpt`` only: a learned position table of ``seq_len`` rows (default true, as GPT-2
                          and GPT-3); false for rotary positions without parameters (GPT-NeoX: Black et al.
                          2022, sec 2.1; Su et al. 2021)
``image_size``            ``cnn`` only: input height = width in pixels, a multiple of 32 (default 224)
``stage_blocks``          ``cnn`` only: bottleneck blocks per stage (default ``[3, 4, 6, 3]``, ResNet-50);
                          their sum must equal ``layers``
========================  =====================================================================================

``plansim.workload.loader.load_model`` also reads a Hugging Face ``config.json`` (GPT-2, GPT-NeoX, Llama, Mistral,
Qwen2), through ``plansim.workload.hf_config``, and traces a ``torch.nn.Module`` given with ``inputs=``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from plansim.limits import field, integral
from plansim.workload.cnn import resnet_parameters

__all__ = ["FAMILY_ORDER", "ModelSpec"]

Family = Literal["gpt", "llama", "mlp", "cnn"]
FAMILY_ORDER = ("gpt", "llama", "mlp", "cnn")
_ATTENTION = ("gpt", "llama")

# Per optional key, per family: _REQUIRED, ("absent", value the key takes) or ("default", rule on earlier keys).
_Rule = tuple[str, Any]
_REQUIRED: _Rule = ("required", None)
_RESNET50_STAGES = (3, 4, 6, 3)  # He et al. 2016, Table 1 (50-layer column)


def _four_h(data: Mapping[str, Any]) -> Any:
    return 4 * data["hidden"] if "hidden" in data else None


_FAMILY_RULES: dict[str, dict[str, _Rule]] = {
    "heads": {"gpt": _REQUIRED, "llama": _REQUIRED, "mlp": ("absent", 0), "cnn": ("absent", 0)},
    "kv_heads": {
        "gpt": ("default", lambda d: d.get("heads")),
        "llama": ("default", lambda d: d.get("heads")),
        "mlp": ("absent", 0),
        "cnn": ("absent", 0),
    },
    "ffn_hidden": {
        "gpt": ("default", _four_h),
        "llama": _REQUIRED,
        "mlp": ("default", _four_h),
        "cnn": ("absent", 0),
    },
    "seq_len": {"gpt": _REQUIRED, "llama": _REQUIRED, "mlp": ("default", lambda d: 1), "cnn": ("absent", 1)},
    "tied_embeddings": {
        "gpt": ("default", lambda d: True),
        "llama": ("default", lambda d: False),
        "mlp": ("absent", False),
        "cnn": ("absent", False),
    },
    "learned_positions": {
        "gpt": ("default", lambda d: True),
        "llama": ("absent", False),
        "mlp": ("absent", False),
        "cnn": ("absent", False),
    },
    "image_size": {
        "gpt": ("absent", 0),
        "llama": ("absent", 0),
        "mlp": ("absent", 0),
        "cnn": ("default", lambda d: 224),
    },
    "stage_blocks": {
        "gpt": ("absent", ()),
        "llama": ("absent", ()),
        "mlp": ("absent", ()),
        "cnn": ("default", lambda d: _RESNET50_STAGES),
    },
}
# What a key holds when its family rule cannot apply (the family, or a key it depends on, is itself invalid).
_FILL: dict[str, Any] = dict(
    heads=0,
    kv_heads=0,
    ffn_hidden=0,
    seq_len=1,
    tied_embeddings=False,
    learned_positions=False,
    image_size=0,
    stage_blocks=(),
)


def _bad(message: str) -> PydanticCustomError:
    return PydanticCustomError("model_shape", message)


class ModelSpec(BaseModel):
    """One model's architecture, as read from a preset or a YAML file (keys: see the module docstring).

    Family defaults are filled in on validation, so ``kv_heads``, ``ffn_hidden``, ``seq_len``, ``image_size``,
    ``stage_blocks``, ``tied_embeddings`` and ``learned_positions`` always hold the value in force. Keys a family does
    not use hold a neutral value (``heads=0`` for ``mlp``/``cnn``; ``seq_len=1`` for ``cnn``).

    Examples
    --------
    >>> spec = ModelSpec(name="tiny", family="gpt", layers=2, hidden=64, heads=4, seq_len=16, vocab=100)
    >>> spec.ffn_hidden, spec.kv_heads, spec.head_dim, spec.tied_embeddings
    (256, 4, 16, True)
    >>> spec.num_parameters()
    107520
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    family: Family
    layers: int = field("layers")
    hidden: int = field("hidden")
    heads: int = field("heads", default=None, validate_default=True)
    kv_heads: int = field("kv_heads", default=None, validate_default=True)
    ffn_hidden: int = field("ffn_hidden", default=None, validate_default=True)
    seq_len: int = field("seq_len", default=None, validate_default=True)
    vocab: int = field("vocab")
    tied_embeddings: bool = Field(default=None, validate_default=True)
    learned_positions: bool = Field(default=None, validate_default=True)
    image_size: int = field("image_size", default=None, validate_default=True)
    stage_blocks: tuple[Annotated[int, field("stage_blocks")], ...] = Field(
        default=None, max_length=10_000, validate_default=True
    )

    @field_validator(
        "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "seq_len", "vocab", "image_size", mode="before"
    )
    @classmethod
    def _whole(cls, value: Any) -> Any:
        return integral(value)

    @field_validator(*_FAMILY_RULES, mode="before")
    @classmethod
    def _family_default(cls, value: Any, info: ValidationInfo) -> Any:
        """Fill a family's default, or reject a key the family requires but lacks or does not use."""
        field, family = info.field_name or "", info.data.get("family")
        rule = _FAMILY_RULES[field].get(family) if isinstance(family, str) else None
        if rule is None:  # family itself is invalid: its error is reported; keep this key quiet
            return _FILL[field] if value is None else value
        what, fill = rule
        if what == "required":
            if value is None:
                raise _bad(f"{family} models need '{field}': add it")
            return value
        if what == "absent":
            if value is not None:
                raise _bad(f"{family} models do not use '{field}': remove it")
            return fill
        if value is None:
            value = fill(info.data)
        return _FILL[field] if value is None else value

    @field_validator("heads")
    @classmethod
    def _heads_divide_hidden(cls, heads: int, info: ValidationInfo) -> int:
        hidden = info.data.get("hidden")
        if info.data.get("family") in _ATTENTION and hidden is not None:
            if heads < 1:
                raise _bad(f"heads={heads} must be at least 1")
            if hidden % heads:
                raise _bad(f"heads={heads} does not divide hidden={hidden}: pick heads that divide hidden")
        return heads

    @field_validator("kv_heads")
    @classmethod
    def _kv_heads_divide_heads(cls, kv_heads: int, info: ValidationInfo) -> int:
        heads = info.data.get("heads")
        if info.data.get("family") in _ATTENTION and heads and (kv_heads < 1 or heads % kv_heads):
            raise _bad(f"kv_heads={kv_heads} does not divide heads={heads}: pick kv_heads that divide heads")
        return kv_heads

    @field_validator("ffn_hidden")
    @classmethod
    def _ffn_positive(cls, ffn_hidden: int, info: ValidationInfo) -> int:
        if info.data.get("family") in ("gpt", "llama", "mlp") and ffn_hidden < 1:
            raise _bad(f"ffn_hidden={ffn_hidden} must be at least 1")
        return ffn_hidden

    @field_validator("image_size")
    @classmethod
    def _image_size_multiple_of_32(cls, image_size: int, info: ValidationInfo) -> int:
        if info.data.get("family") == "cnn" and (image_size < 32 or image_size % 32):
            raise _bad(f"image_size={image_size} must be a positive multiple of 32 (five stride-2 stages)")
        return image_size

    @field_validator("stage_blocks")
    @classmethod
    def _stages_sum_to_layers(cls, stage_blocks: tuple[int, ...], info: ValidationInfo) -> tuple[int, ...]:
        layers = info.data.get("layers")
        if info.data.get("family") == "cnn" and layers is not None:
            if not stage_blocks or min(stage_blocks) < 1:
                raise _bad(f"stage_blocks={list(stage_blocks)} needs at least one block in every stage")
            if sum(stage_blocks) != layers:
                total = sum(stage_blocks)
                raise _bad(f"stage_blocks={list(stage_blocks)} sums to {total}, not layers={layers}: make them agree")
        return stage_blocks

    @property
    def head_dim(self) -> int:
        """Width of one attention head, ``hidden // heads`` (0 for families without attention)."""
        return self.hidden // self.heads if self.heads else 0

    def num_parameters(self) -> int:
        """Total trainable parameters, embeddings and any untied output head included.

        GPT: ``l(12h^2 + 13h) + (V + s)h + 2h`` with ``ffn_hidden = 4h`` and a tied output head (Narayanan et
        al. 2021, sec 5.1, plus biases and LayerNorms; ``sh`` is the learned position table, absent with rotary
        positions). Llama: ``l(2h^2 + 2h h_kv + 3hf + 2h) + 2Vh + h``.
        MLP: ``l(2hf + f + h) + hV + V``. CNN: conv weights, BatchNorm scale and shift, fc weight and bias.
        """
        counts: dict[str, Callable[[ModelSpec], int]] = {
            "gpt": _transformer_parameters,
            "llama": _transformer_parameters,
            "mlp": _mlp_parameters,
            "cnn": _cnn_parameters,
        }
        return counts[self.family](self)

    def file_fields(self) -> dict[str, Any]:
        """The keys of a model YAML file that gives this spec back: every key its family uses, none it rejects.

        >>> spec = ModelSpec(name="tiny", family="llama", layers=2, hidden=64, heads=4, ffn_hidden=96, seq_len=8,
        ...                  vocab=100)
        >>> ModelSpec.model_validate(spec.file_fields()) == spec
        True
        >>> "learned_positions" in spec.file_fields()
        False
        """
        data = self.model_dump()
        unused = [key for key, rules in _FAMILY_RULES.items() if rules[self.family][0] == "absent"]
        for key in unused:
            del data[key]
        if "stage_blocks" in data:
            data["stage_blocks"] = list(data["stage_blocks"])
        return data


def _transformer_parameters(spec: ModelSpec) -> int:
    h, f, v, gpt = spec.hidden, spec.ffn_hidden, spec.vocab, spec.family == "gpt"
    qkv = h + 2 * spec.kv_heads * spec.head_dim
    attention = h * qkv + h * h + ((qkv + h) if gpt else 0)  # QKV and out-proj weights (+ biases for GPT)
    mlp = (2 * h * f + f + h) if gpt else 3 * h * f  # fc1, fc2 (+ biases) or SwiGLU gate, up, down
    norms = 4 * h if gpt else 2 * h  # LayerNorm scale+shift, or RMSNorm scale, twice per block
    final_norm = 2 * h if gpt else h
    embeddings = v * h + (spec.seq_len * h if spec.learned_positions else 0)  # word (+ learned positions)
    output = 0 if spec.tied_embeddings else v * h
    return spec.layers * (attention + mlp + norms) + final_norm + embeddings + output


def _mlp_parameters(spec: ModelSpec) -> int:
    h, f = spec.hidden, spec.ffn_hidden
    return spec.layers * (2 * h * f + f + h) + h * spec.vocab + spec.vocab


def _cnn_parameters(spec: ModelSpec) -> int:
    return resnet_parameters(spec)
