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
from plansim.workload.shape import ModelShape as BuilderShape
from plansim.workload.transformer import add_transformer, sequence_split_problems, transformer_parameters

__all__ = [
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
    ffn_hidden=0,
    seq_len=1,
    tied_embeddings=False,
    learned_positions=False,
    image_size=0,
    stage_blocks=(),
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
        defaults={"kv_heads": _heads, "tied_embeddings": lambda d: False},
        axis_rules={"tp": _heads_split, "cp": sequence_split_problems},
        transformer=True,
        hf_model_types={"llama": _LLAMA, "mistral": _LLAMA, "qwen2": _LLAMA},
        torch_model="llama",
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
    ['gpt2', 'gpt_neox', 'llama', 'mistral', 'qwen2']
    """
    return {t: (f, hf) for f in FAMILIES.values() for t, hf in f.hf_model_types.items()}
