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
``head_dim``              width of one query/key head (default ``hidden / heads``; Qwen3 uses 128 where that is
                          64): the attention's shapes, FLOPs, bytes and parameters read it (``gpt``, ``llama``,
                          ``moe``); a model file need not give it, and ``file_fields`` leaves out the default
``ffn_hidden``            feed-forward width (default ``4 * hidden`` for ``gpt`` and ``mlp``; required for
                          ``llama``, where it is the SwiGLU width; for ``moe`` the width of its dense blocks)
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
``experts``               ``moe`` only: routed experts per MoE block, E (required)
``experts_per_token``     ``moe`` only: experts each token is routed to, the router's top-k (required, <= E)
``expert_ffn_hidden``     ``moe`` only: SwiGLU width of one routed expert (required)
``shared_ffn_hidden``     ``moe`` only: SwiGLU width of the shared experts every token runs, all of them together
                          (DeepSeek: ``n_shared_experts * moe_intermediate_size``; Qwen2-MoE:
                          ``shared_expert_intermediate_size``); default 0, none
``dense_layers``          ``moe`` only: the first blocks that have a dense SwiGLU FFN of ``ffn_hidden`` instead of
                          experts (DeepSeek's ``first_k_dense_replace``); default 0
``capacity_factor``       ``moe`` only: 0 (default) dropless, each expert takes the tokens routed to it; ``c > 0``
                          every expert's buffer is padded to ``c`` times its balanced share of the routed tokens
                          (GShard, Lepikhin et al. 2021 sec 2.2; Megatron-LM's ``moe_expert_capacity_factor`` with
                          ``moe_pad_expert_input_to_capacity``), which its GEMMs and all-to-alls then carry
``moe_imbalance``         ``moe`` only: the routed tokens the busiest expert-parallel rank receives over the mean,
                          >= 1 (default 1.0: balanced); the router's property, as ``seq_len`` is the data's, and
                          set for a run by ``--moe-imbalance`` (``plansim.workload.loader.with_moe_imbalance``);
                          what it costs: ``plansim.workload.moe.Routing``
``q_lora_rank``           ``moe`` only, multi-head latent attention (DeepSeek-V2/V3): the query's low-rank width
                          (0, default: full-rank queries)
``kv_lora_rank``          ``moe`` only: the key/value latent width; 0 (default) is ordinary grouped-query
                          attention, above 0 latent attention, where ``head_dim`` is a query/key head's width,
                          its rotary part included (``qk_nope_head_dim + qk_rope_head_dim``), and ``kv_heads``
                          must equal ``heads``
``rope_head_dim``         ``moe`` with latent attention: the rotary columns of each query/key head, the key's
                          shared across heads (``qk_rope_head_dim``); default 0
``v_head_dim``            ``moe`` only: a value head's width (default ``head_dim``)
========================  =====================================================================================

``plansim.workload.loader.load_model`` also reads a Hugging Face ``config.json`` (GPT-2, GPT-NeoX, Llama, Mistral,
Qwen2, Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3), through ``plansim.workload.hf_config``, and traces a
``torch.nn.Module`` given with ``inputs=``.
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
    head_dim: int = field("head_dim", default=None, validate_default=True)
    ffn_hidden: int = field("ffn_hidden", default=None, validate_default=True)
    seq_len: int = field("seq_len", default=None, validate_default=True)
    vocab: int = field("vocab")
    tied_embeddings: bool = Field(default=None, validate_default=True)
    learned_positions: bool = Field(default=None, validate_default=True)
    image_size: int = field("image_size", default=None, validate_default=True)
    stage_blocks: tuple[Annotated[int, field("stage_blocks")], ...] = Field(
        default=None, max_length=10_000, validate_default=True
    )
    experts: int = field("experts", default=None, validate_default=True)
    experts_per_token: int = field("experts_per_token", default=None, validate_default=True)
    expert_ffn_hidden: int = field("expert_ffn_hidden", default=None, validate_default=True)
    shared_ffn_hidden: int = field("shared_ffn_hidden", default=None, validate_default=True)
    dense_layers: int = field("dense_layers", default=None, validate_default=True)
    capacity_factor: float = field("capacity_factor", default=None, validate_default=True)
    moe_imbalance: float = field("moe_imbalance", default=None, validate_default=True)
    q_lora_rank: int = field("q_lora_rank", default=None, validate_default=True)
    kv_lora_rank: int = field("kv_lora_rank", default=None, validate_default=True)
    rope_head_dim: int = field("rope_head_dim", default=None, validate_default=True)
    v_head_dim: int = field("v_head_dim", default=None, validate_default=True)

    @field_validator(
        "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "seq_len", "vocab", "image_size",
        "experts", "experts_per_token", "expert_ffn_hidden", "shared_ffn_hidden", "dense_layers", "q_lora_rank",
        "kv_lora_rank", "rope_head_dim", "v_head_dim", mode="before",
    )  # fmt: skip
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

    @field_validator("head_dim", "v_head_dim", "expert_ffn_hidden")
    @classmethod
    def _width_positive(cls, width: int, info: ValidationInfo) -> int:
        if _uses(info, info.field_name or "") and width < 1:
            raise _bad(f"{info.field_name}={width} must be at least 1")
        return width

    @field_validator("experts_per_token")
    @classmethod
    def _top_k_within_experts(cls, top_k: int, info: ValidationInfo) -> int:
        experts = info.data.get("experts")
        if _uses(info, "experts_per_token") and experts is not None:
            if experts < 1:
                raise _bad(f"experts={experts} must be at least 1")
            if not 1 <= top_k <= experts:
                raise _bad(f"experts_per_token={top_k} must be 1 to experts={experts}: pick the router's top-k")
        return top_k

    @field_validator("dense_layers")
    @classmethod
    def _dense_within_layers(cls, dense: int, info: ValidationInfo) -> int:
        layers = info.data.get("layers")
        if _uses(info, "dense_layers") and layers is not None and dense > layers:
            raise _bad(f"dense_layers={dense} exceeds layers={layers}: at most layers")
        return dense

    @field_validator("rope_head_dim")
    @classmethod
    def _latent_attention(cls, rope: int, info: ValidationInfo) -> int:
        """Latent attention (``kv_lora_rank > 0``) rotates ``rope_head_dim`` of each head's ``head_dim`` columns and
        has a key and value per query head; without it the latent keys are refused."""
        if not _uses(info, "rope_head_dim"):
            return rope
        data = info.data
        if data.get("kv_lora_rank"):
            head_dim, heads, kv_heads = data.get("head_dim"), data.get("heads"), data.get("kv_heads")
            if head_dim is not None and not 1 <= rope < head_dim:
                raise _bad(f"rope_head_dim={rope} must be 1 to head_dim-1={head_dim - 1} with kv_lora_rank")
            if heads and kv_heads and kv_heads != heads:
                raise _bad(f"kv_heads={kv_heads} must equal heads={heads} with latent attention (kv_lora_rank)")
        elif rope or data.get("q_lora_rank"):
            raise _bad("q_lora_rank and rope_head_dim describe latent attention: give kv_lora_rank too, or remove them")
        return rope

    @field_validator("v_head_dim")
    @classmethod
    def _value_heads_of_latent_attention(cls, v_head_dim: int, info: ValidationInfo) -> int:
        """Value heads narrower or wider than the query/key heads only under latent attention (the grouped-query
        projection has ``head_dim``-wide values)."""
        data = info.data
        head_dim = data.get("head_dim")
        if _uses(info, "v_head_dim") and not data.get("kv_lora_rank") and head_dim and v_head_dim != head_dim:
            raise _bad(f"v_head_dim={v_head_dim} differs from head_dim={head_dim} without latent attention: "
                       "remove it or give kv_lora_rank")  # fmt: skip
        return v_head_dim

    @property
    def moe_layers(self) -> int:
        """Blocks whose FFN is a mixture of experts (every block past ``dense_layers``; 0 for other families)."""
        return self.layers - self.dense_layers if self.experts else 0

    def active_parameters(self) -> int:
        """Parameters one token runs through: ``num_parameters`` for every family but ``moe``, where a MoE block
        counts its router, shared experts and ``experts_per_token`` of its routed experts. The input embedding and
        the output head count (the convention that gives Mixtral 8x7B's published 12.9B active parameters, Mistral
        AI, "Mixtral of experts", 2023-12-11; see ``plansim.workload.moe.moe_parameters``)."""
        family = FAMILIES[self.family]
        return (family.active_parameters or family.parameters)(self)

    def num_parameters(self) -> int:
        """Total trainable parameters, embeddings and any untied output head included: the family's count.

        GPT: ``l(12h^2 + 13h) + (V + s)h + 2h`` with ``ffn_hidden = 4h`` and a tied output head (Narayanan et
        al. 2021, sec 5.1, plus biases and LayerNorms; ``sh`` is the learned position table, absent with rotary
        positions). Llama: ``l(2h^2 + 2h h_kv + 3hf + 2h) + 2Vh + h``. MoE: every expert counted
        (``plansim.workload.moe.moe_parameters``).
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
        if self.heads and self.head_dim == self.hidden // self.heads:
            unused.append("head_dim")  # the default: a file need not say it
        if self.moe_imbalance == 1.0 and "moe_imbalance" not in unused:
            unused.append("moe_imbalance")  # balanced, the default
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
