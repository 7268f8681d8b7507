"""The model schema (``ModelSpec``); ``plansim.workload.loader`` loads it from preset names, YAML files and
Hugging Face configs.

A model file holds one mapping with the keys below; unknown keys are rejected. Keys a family does not use are
rejected too, so a typo cannot silently change nothing. Which keys each family requires, defaults or refuses is
its entry's (``plansim.workload.families.FAMILIES``); ``family`` is any of the registry's names.

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

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from plansim.limits import field, integral
from plansim.workload.families import FAMILIES, UNUSED, Family

__all__ = ["ModelSpec"]


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
    family: str
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

    @field_validator("family", mode="before")
    @classmethod
    def _registered_family(cls, value: Any) -> Any:
        """One of the registry's families (``plansim.workload.families.FAMILIES``), read when the model is."""
        if isinstance(value, str) and value in FAMILIES:
            return value
        names = [repr(name) for name in FAMILIES]
        expected = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
        raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})

    @field_validator(*UNUSED, mode="before")
    @classmethod
    def _family_default(cls, value: Any, info: ValidationInfo) -> Any:
        """Fill a family's default, or reject a key the family requires but lacks or does not use."""
        field, family = info.field_name or "", _family(info)
        if family is None:  # family itself is invalid: its error is reported; keep this key quiet
            return UNUSED[field] if value is None else value
        if field in family.required:
            if value is None:
                raise _bad(f"{family.name} models need '{field}': add it")
            return value
        if field not in family.defaults:
            if value is not None:
                raise _bad(f"{family.name} models do not use '{field}': remove it")
            return UNUSED[field]
        if value is None:
            value = family.defaults[field](info.data)
        return UNUSED[field] if value is None else value

    @field_validator("heads")
    @classmethod
    def _heads_divide_hidden(cls, heads: int, info: ValidationInfo) -> int:
        hidden = info.data.get("hidden")
        if _uses(info, "heads") and hidden is not None:
            if heads < 1:
                raise _bad(f"heads={heads} must be at least 1")
            if hidden % heads:
                raise _bad(f"heads={heads} does not divide hidden={hidden}: pick heads that divide hidden")
        return heads

    @field_validator("kv_heads")
    @classmethod
    def _kv_heads_divide_heads(cls, kv_heads: int, info: ValidationInfo) -> int:
        heads = info.data.get("heads")
        if _uses(info, "kv_heads") and heads and (kv_heads < 1 or heads % kv_heads):
            raise _bad(f"kv_heads={kv_heads} does not divide heads={heads}: pick kv_heads that divide heads")
        return kv_heads

    @field_validator("ffn_hidden")
    @classmethod
    def _ffn_positive(cls, ffn_hidden: int, info: ValidationInfo) -> int:
        if _uses(info, "ffn_hidden") and ffn_hidden < 1:
            raise _bad(f"ffn_hidden={ffn_hidden} must be at least 1")
        return ffn_hidden

    @field_validator("image_size")
    @classmethod
    def _image_size_multiple_of_32(cls, image_size: int, info: ValidationInfo) -> int:
        if _uses(info, "image_size") and (image_size < 32 or image_size % 32):
            raise _bad(f"image_size={image_size} must be a positive multiple of 32 (five stride-2 stages)")
        return image_size

    @field_validator("stage_blocks")
    @classmethod
    def _stages_sum_to_layers(cls, stage_blocks: tuple[int, ...], info: ValidationInfo) -> tuple[int, ...]:
        layers = info.data.get("layers")
        if _uses(info, "stage_blocks") and layers is not None:
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
        """Total trainable parameters, embeddings and any untied output head included: the family's count.

        GPT: ``l(12h^2 + 13h) + (V + s)h + 2h`` with ``ffn_hidden = 4h`` and a tied output head (Narayanan et
        al. 2021, sec 5.1, plus biases and LayerNorms; ``sh`` is the learned position table, absent with rotary
        positions). Llama: ``l(2h^2 + 2h h_kv + 3hf + 2h) + 2Vh + h``.
        MLP: ``l(2hf + f + h) + hV + V``. CNN: conv weights, BatchNorm scale and shift, fc weight and bias.
        """
        return FAMILIES[self.family].parameters(self)

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
        unused = [key for key in UNUSED if not FAMILIES[self.family].uses(key)]
        for key in unused:
            del data[key]
        if "stage_blocks" in data:
            data["stage_blocks"] = list(data["stage_blocks"])
        return data


def _family(info: ValidationInfo) -> Family | None:
    """The entry of the family validated so far; None when it was invalid (its own error is reported)."""
    family = info.data.get("family")
    return FAMILIES.get(family) if isinstance(family, str) else None


def _uses(info: ValidationInfo, key: str) -> bool:
    """Whether the (valid) family being validated reads ``key``: its shape rules apply only then."""
    family = _family(info)
    return family is not None and family.uses(key)
