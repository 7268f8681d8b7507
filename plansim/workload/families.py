"""The model families: ``FAMILIES``, the one list of them, each entry holding what is particular to its family.

An entry (``Family``) holds its op-graph builder (``build_sharded`` calls it), its parameter count
(``ModelSpec.num_parameters``), the ``ModelSpec`` keys it requires or fills with a default (every other optional key
is refused: ``ModelSpec`` reads them), what each parallel axis must satisfy to split it (``axis_problems``: the
strategy checks and the planner's search read it), whether its blocks are transformer blocks (Megatron-LM overlaps
only those GEMMs with their collectives: ``tp_comm_overlap``), the Hugging Face ``model_type`` values the importer
maps onto it (``plansim.workload.hf_config``), and the block of the validator's PyTorch model
(``plansim.profiling.torch_models``), where it has one. The registry's order is the listing order
(``plansim models``). A family added to ``FAMILIES`` is accepted by ``ModelSpec``, built, checked, searched and
imported like a shipped one.

Sources: the builders' sharding is Megatron-LM's (Shoeybi et al. 2019, sec 3): heads split ``tp`` ways, key/value
heads too (grouped-query attention, Ainslie et al. 2023); ResNet (He et al. 2016) is modelled data- and
pipeline-parallel only. Transformer Engine's userbuffers overlap only transformer blocks' qkv, proj, fc1 and fc2
GEMMs (Megatron-LM ``megatron/core/extensions/transformer_engine.py:302-312`` at core_v0.15.0).

>>> FAMILIES["llama"].uses("kv_heads"), FAMILIES["cnn"].uses("heads"), FAMILIES["gpt"].transformer
(True, False, True)
>>> from plansim.workload import load_model
>>> axis_problems(load_model("llama3-8b"), "tp", 16)
['tp=16 does not divide kv_heads=8: use tp <= 8']
>>> axis_problems(load_model("resnet50"), "tp", 2), axis_problems(load_model("resnet50"), "pp", 2)
(['tp=2: cnn models support tp=1 only: use dp or pp'], [])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, Protocol

import networkx as nx

from plansim.errors import PlansimError
from plansim.workload.cnn import add_cnn, resnet_parameters
from plansim.workload.graph import Sharding
from plansim.workload.mlp import add_mlp, mlp_parameters
from plansim.workload.moe import add_moe, moe_parameters
from plansim.workload.shape import ModelShape as BuilderShape
from plansim.workload.transformer import add_transformer, sequence_split_problems, transformer_parameters

__all__ = [
    "EXPERT_KEYS",
    "FAMILIES",
    "UNUSED",
    "AxisRule",
    "Family",
    "HFFamily",
    "ModelShape",
    "axis_problems",
    "family_of",
    "hf_model_types",
]


class ModelShape(BuilderShape, Protocol):
    """What the entries read of a model (a ``ModelSpec`` has these fields)."""

    @property
    def family(self) -> str: ...


#: ``(model, degree) -> problems``: what a parallel axis of ``degree`` ranks breaks in ``model`` (none: it splits).
AxisRule = Callable[[ModelShape, int], list[str]]

#: The optional ``ModelSpec`` keys, with what each holds in a model whose family does not use it.
UNUSED: dict[str, Any] = dict(
    heads=0,
    kv_heads=0,
    head_dim=0,
    ffn_hidden=0,
    seq_len=1,
    tied_embeddings=False,
    learned_positions=False,
    image_size=0,
    stage_blocks=(),
    experts=0,
    experts_per_token=0,
    expert_ffn_hidden=0,
    shared_ffn_hidden=0,
    dense_layers=0,
    capacity_factor=0.0,
    moe_imbalance=1.0,
    q_lora_rank=0,
    kv_lora_rank=0,
    rope_head_dim=0,
    v_head_dim=0,
)

_RESNET50_STAGES = (3, 4, 6, 3)  # He et al. 2016, Table 1 (50-layer column)


@dataclass(frozen=True)
class HFFamily:
    """How one Hugging Face ``model_type`` maps onto its plansim family.

    ``keys`` maps each ModelSpec field to its config key (``seq_len`` to the context length); ``optional`` lists
    the fields whose key may be absent or null (the family default applies); ``tied`` is ``tie_word_embeddings``
    when the file leaves it out; ``learned_positions``: the model has a learned position table (its rows bound
    ``seq_len``).
    """

    keys: dict[str, str]
    tied: bool
    learned_positions: bool
    optional: tuple[str, ...] = field(default=())
    #: fields computed from several config keys (DeepSeek's head width, its shared experts' width), or from keys
    #: that may be 0: ``config -> {field: value}``; each reader names the keys it reads and checks them
    derived: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    #: refusals: ``config -> problem or None`` (a layout plansim does not express), one line each
    refuse: Callable[[Mapping[str, Any]], str | None] | None = None


@dataclass(frozen=True)
class Family:
    """One model family.

    ``build(graph, spec, sharding)`` adds one micro-batch's ops on one tensor-parallel rank to ``graph`` and returns
    the bytes of one block's input on that rank; ``parameters(spec)`` counts the trainable parameters. ``required``:
    the optional ``ModelSpec`` keys (``UNUSED``) a model file must give; ``defaults``: those it may leave out, each
    with its default computed from the keys before it; every other optional key is refused and holds its
    ``UNUSED`` value. ``axis_rules``: per parallel axis (the mesh's names: ``tp``, ``cp``, ``dp``, ``pp``) what a degree
    must satisfy, as problems; an axis without a rule splits any model of the family. ``transformer``: its blocks
    are transformer blocks (``tp_comm_overlap`` applies). ``hf_model_types``: the Hugging Face ``model_type`` values
    mapped onto the family. ``torch_model``: the block of the validator's PyTorch model (``gpt``: LayerNorm, GELU,
    biases, dropout; ``llama``: RMSNorm, SwiGLU, no biases), None where the validator builds none.
    ``active_parameters``: the parameters one token runs through, where the family routes tokens (``moe``); None:
    ``parameters``.
    """

    name: str
    build: Callable[[nx.DiGraph, ModelShape, Sharding], int]
    parameters: Callable[[ModelShape], int]
    required: tuple[str, ...] = ()
    defaults: Mapping[str, Callable[[Mapping[str, Any]], Any]] = field(default_factory=dict)
    axis_rules: Mapping[str, AxisRule] = field(default_factory=dict)
    transformer: bool = False
    hf_model_types: Mapping[str, HFFamily] = field(default_factory=dict)
    torch_model: Literal["gpt", "llama"] | None = None
    #: the parameters one token runs through (``ModelSpec.active_parameters``); None: all of them
    active_parameters: Callable[[ModelShape], int] | None = None

    def __post_init__(self) -> None:
        unknown = sorted({*self.required, *self.defaults} - set(UNUSED))
        if unknown:
            raise PlansimError(
                f"family {self.name}: {', '.join(unknown)} are not optional ModelSpec keys: use among "
                f"{', '.join(UNUSED)}"
            )
        both = sorted(set(self.required) & set(self.defaults))
        if both:
            raise PlansimError(f"family {self.name}: {', '.join(both)} both required and defaulted: keep one")

    def uses(self, key: str) -> bool:
        """Whether a model of this family reads ``key`` (required or defaulted); the others are refused."""
        return key in self.required or key in self.defaults


def _four_h(data: Mapping[str, Any]) -> Any:
    return 4 * data["hidden"] if "hidden" in data else None


def _heads(data: Mapping[str, Any]) -> Any:
    return data.get("heads")


def _head_dim(data: Mapping[str, Any]) -> Any:
    """``hidden / heads``: the head width a model file need not give (None while either is invalid)."""
    hidden, heads = data.get("hidden"), data.get("heads")
    return hidden // heads if hidden and heads else None


def _no_latent_cp(model: ModelShape, cp: int) -> list[str]:
    """Context parallelism splits the sequence (``sequence_split_problems``); latent attention is not modelled
    under it."""
    if cp > 1 and model.kv_lora_rank:
        return [f"cp={cp}: context parallelism with the latent attention of {model.name} is not modelled: use cp=1"]
    return sequence_split_problems(model, cp)


def _positive(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlansimError(f"HF config: '{key}' must be a positive integer, got {value!r}: fix it")
    return value


def _count(config: Mapping[str, Any], key: str) -> int:
    value = config.get(key)
    value = 0 if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlansimError(f"HF config: '{key}' must be a whole number >= 0, got {value!r}: fix it")
    return value


def _deepseek_v3(config: Mapping[str, Any]) -> dict[str, Any]:
    """DeepSeek-V3's fields that are no single config key: a query/key head's width ``qk_nope_head_dim +
    qk_rope_head_dim``, the shared experts' width ``n_shared_experts * moe_intermediate_size``, the dense blocks
    ``first_k_dense_replace`` and the query's ``q_lora_rank`` (null: full-rank queries); the keys of transformers'
    ``DeepseekV3Config``."""
    nope, rope = _positive(config, "qk_nope_head_dim"), _positive(config, "qk_rope_head_dim")
    shared = _count(config, "n_shared_experts") * _positive(config, "moe_intermediate_size")
    return {
        "head_dim": nope + rope,
        "shared_ffn_hidden": shared,
        "dense_layers": _count(config, "first_k_dense_replace"),
        "q_lora_rank": _count(config, "q_lora_rank"),
    }


def _qwen_sparse_layout(config: Mapping[str, Any]) -> str | None:
    """Qwen2-/Qwen3-MoE place experts on every ``decoder_sparse_step``-th block but the ``mlp_only_layers``; plansim
    expresses only a dense prefix (``dense_layers``), so it reads every block sparse (step 1, no dense list: the
    transformers defaults and every released Qwen MoE config) and refuses the rest."""
    step, dense = config.get("decoder_sparse_step", 1), config.get("mlp_only_layers") or []
    if step != 1 or dense:
        return (
            f"decoder_sparse_step={step!r} and mlp_only_layers={dense!r}: plansim models experts on every block past "
            "a dense prefix only: write a model YAML with dense_layers"
        )
    return None


def _heads_split(model: ModelShape, tp: int) -> list[str]:
    """Megatron-LM splits the attention heads and the key/value heads ``tp`` ways."""
    if model.heads % tp:
        return [f"tp={tp} does not divide heads={model.heads}: choose tp among the divisors of the heads"]
    if model.kv_heads % tp:
        return [f"tp={tp} does not divide kv_heads={model.kv_heads}: use tp <= {model.kv_heads}"]
    return []


def _no_sequence(model: ModelShape, cp: int) -> list[str]:
    """No sequence to split: the family's builder has no attention over tokens."""
    return [f"cp={cp}: {model.family} models have no sequence to split: use dp or pp"] if cp > 1 else []


def _unsplit(model: ModelShape, tp: int) -> list[str]:
    """No tensor parallelism: the builder keeps the whole model on each rank."""
    return [f"tp={tp}: {model.family} models support tp=1 only: use dp or pp"] if tp > 1 else []


_ROTARY_KEYS = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "ffn_hidden": "intermediate_size",
    "seq_len": "max_position_embeddings",
    "vocab": "vocab_size",
}
_GPT2_KEYS = {
    "layers": "n_layer",
    "hidden": "n_embd",
    "heads": "n_head",
    "ffn_hidden": "n_inner",
    "seq_len": "n_positions",
    "vocab": "vocab_size",
}
_LLAMA_KEYS = {**_ROTARY_KEYS, "kv_heads": "num_key_value_heads"}
_LLAMA = HFFamily(_LLAMA_KEYS, tied=False, learned_positions=False, optional=("kv_heads",))
_MOE_KEYS = {**_LLAMA_KEYS, "experts_per_token": "num_experts_per_tok"}
_QWEN_MOE_KEYS = {**_MOE_KEYS, "experts": "num_experts", "expert_ffn_hidden": "moe_intermediate_size"}
#: transformers' configuration classes of these names: MixtralConfig (every expert ``intermediate_size`` wide, the
#: model has no dense block), Qwen2MoeConfig (``shared_expert_intermediate_size``), Qwen3MoeConfig (``head_dim``),
#: DeepseekV3Config (latent attention, shared experts, ``first_k_dense_replace``)
_MOE_TYPES = {
    "mixtral": HFFamily(
        {**_MOE_KEYS, "experts": "num_local_experts", "expert_ffn_hidden": "intermediate_size", "head_dim": "head_dim"},
        tied=False, learned_positions=False, optional=("kv_heads", "head_dim"),
    ),
    "qwen2_moe": HFFamily(
        {**_QWEN_MOE_KEYS, "shared_ffn_hidden": "shared_expert_intermediate_size"},
        tied=False, learned_positions=False, optional=("kv_heads", "shared_ffn_hidden"), refuse=_qwen_sparse_layout,
    ),
    "qwen3_moe": HFFamily(
        {**_QWEN_MOE_KEYS, "head_dim": "head_dim"},
        tied=False, learned_positions=False, optional=("kv_heads", "head_dim"), refuse=_qwen_sparse_layout,
    ),
    "deepseek_v3": HFFamily(
        {**_QWEN_MOE_KEYS, "experts": "n_routed_experts", "kv_lora_rank": "kv_lora_rank",
         "rope_head_dim": "qk_rope_head_dim", "v_head_dim": "v_head_dim"},
        tied=False, learned_positions=False, optional=("kv_heads",), derived=_deepseek_v3,
    ),
}  # fmt: skip
#: The config keys that say a model has experts: a dense ``model_type`` carrying one is refused, not read as dense.
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")

#: The model families, in listing order.
FAMILIES: dict[str, Family] = {
    "gpt": Family(
        "gpt",
        partial(add_transformer, gpt=True),
        partial(transformer_parameters, gpt=True),
        required=("heads", "seq_len"),
        defaults={
            "kv_heads": _heads,
            "ffn_hidden": _four_h,
            "tied_embeddings": lambda d: True,
            "learned_positions": lambda d: True,
            "head_dim": _head_dim,
        },
        axis_rules={"tp": _heads_split, "cp": sequence_split_problems},
        transformer=True,
        hf_model_types={
            "gpt2": HFFamily(_GPT2_KEYS, tied=True, learned_positions=True, optional=("ffn_hidden",)),
            "gpt_neox": HFFamily(_ROTARY_KEYS, tied=False, learned_positions=False),
        },
        torch_model="gpt",
    ),
    "llama": Family(
        "llama",
        partial(add_transformer, gpt=False),
        partial(transformer_parameters, gpt=False),
        required=("heads", "ffn_hidden", "seq_len"),
        defaults={"kv_heads": _heads, "head_dim": _head_dim, "tied_embeddings": lambda d: False},
        axis_rules={"tp": _heads_split, "cp": sequence_split_problems},
        transformer=True,
        hf_model_types={"llama": _LLAMA, "mistral": _LLAMA, "qwen2": _LLAMA},
        torch_model="llama",
    ),
    "moe": Family(
        "moe",
        add_moe,
        moe_parameters,
        required=("heads", "ffn_hidden", "seq_len", "experts", "experts_per_token", "expert_ffn_hidden"),
        defaults={
            "kv_heads": _heads,
            "head_dim": _head_dim,
            "tied_embeddings": lambda d: False,
            "shared_ffn_hidden": lambda d: 0,
            "dense_layers": lambda d: 0,
            "capacity_factor": lambda d: 0.0,
            "moe_imbalance": lambda d: 1.0,
            "q_lora_rank": lambda d: 0,
            "kv_lora_rank": lambda d: 0,
            "rope_head_dim": lambda d: 0,
            "v_head_dim": lambda d: d.get("head_dim"),
        },
        axis_rules={"tp": _heads_split, "cp": _no_latent_cp},
        transformer=True,
        hf_model_types=_MOE_TYPES,
        active_parameters=partial(moe_parameters, active=True),
    ),
    "mlp": Family(
        "mlp",
        add_mlp,
        mlp_parameters,
        defaults={"ffn_hidden": _four_h, "seq_len": lambda d: 1},
        axis_rules={"cp": _no_sequence},
    ),
    "cnn": Family(
        "cnn",
        add_cnn,
        resnet_parameters,
        defaults={"image_size": lambda d: 224, "stage_blocks": lambda d: _RESNET50_STAGES},
        axis_rules={"tp": _unsplit, "cp": _no_sequence},
    ),
}


def family_of(model: ModelShape) -> Family:
    """The registry's entry for ``model``'s family (``ModelSpec`` has validated it against ``FAMILIES``)."""
    return FAMILIES[model.family]


def axis_problems(model: ModelShape, axis: str, degree: int) -> list[str]:
    """What ``degree`` ranks on ``axis`` break in ``model``, by its family's rule for that axis (none: it splits)."""
    rule = family_of(model).axis_rules.get(axis)
    return rule(model, degree) if rule is not None else []


def hf_model_types() -> dict[str, tuple[Family, HFFamily]]:
    """Every Hugging Face ``model_type`` the importer reads, in registry order, with its family and key mapping.

    >>> list(hf_model_types())
    ['gpt2', 'gpt_neox', 'llama', 'mistral', 'qwen2', 'mixtral', 'qwen2_moe', 'qwen3_moe', 'deepseek_v3']
    """
    return {t: (f, hf) for f in FAMILIES.values() for t, hf in f.hf_model_types.items()}
