"""Hugging Face ``config.json`` files as plansim models (``plansim import``; ``load_model("path/config.json")``).

The file is read with ``json`` alone (no ``transformers``). Each supported ``model_type`` maps onto a plansim
family (its entry's ``hf_model_types`` in ``plansim.workload.families``); the keys read are those of the
transformers configuration classes of that name:

===========================  ========  =================================================================  =======
``model_type``               family    keys (layers, hidden, heads, kv heads, ffn, context, vocabulary)   tied
===========================  ========  =================================================================  =======
``gpt2``                     ``gpt``   ``n_layer``, ``n_embd``, ``n_head``, -, ``n_inner`` (null: 4h),    true
                                       ``n_positions``, ``vocab_size``; learned positions
``gpt_neox``                 ``gpt``   ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,   false
                                       -, ``intermediate_size``, ``max_position_embeddings``,
                                       ``vocab_size``; rotary positions (``learned_positions: false``)
``llama``, ``mistral``,      ``llama`` the same, with ``num_key_value_heads`` (absent or null: the heads)    false
``qwen2``
``mixtral``                  ``moe``   the same, ``num_local_experts``, ``num_experts_per_tok``, every      false
                                       expert ``intermediate_size`` wide, ``head_dim`` (optional)
``qwen2_moe``, ``qwen3_moe`` ``moe``   the same, ``num_experts``, ``num_experts_per_tok``,                 false
                                       ``moe_intermediate_size``; ``shared_expert_intermediate_size``
                                       (Qwen2-MoE), ``head_dim`` (Qwen3-MoE); ``intermediate_size`` the
                                       dense width, unused (``decoder_sparse_step`` other than 1 or
                                       ``mlp_only_layers`` are refused)
``deepseek_v3``              ``moe``   the same, ``n_routed_experts``, ``moe_intermediate_size``,          false
                                       ``first_k_dense_replace`` dense blocks of ``intermediate_size``,
                                       ``n_shared_experts`` shared experts; latent attention:
                                       ``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim`` +
                                       ``qk_rope_head_dim`` (``head_dim``), ``v_head_dim``
===========================  ========  =================================================================  =======

"tied" is ``tie_word_embeddings`` when the file leaves it out: the default of transformers' ``GPT2Config``
(``PretrainedConfig``'s true) and of ``GPTNeoXConfig``, ``LlamaConfig``, ``MistralConfig`` and ``Qwen2Config``
(false). ``seq_len`` defaults to the context length (``n_positions`` / ``max_position_embeddings``), the longest
context the model supports, which is not necessarily the length it was trained at (Qwen2.5-7B: 131,072); a learned
position table cannot serve a longer one. ``length_note`` says which length an import took and why. A ``head_dim``
other than ``hidden / heads`` is refused for the dense types (their family reads the head width from those two);
the MoE types read it. A config whose ``model_type`` is dense but which carries an expert key
(``families.EXPERT_KEYS``: ``num_local_experts``, ``num_experts``, ``n_routed_experts``, ``num_experts_per_tok``,
``moe_intermediate_size``) is refused in one line naming the key, never read as a dense model.

What plansim leaves out or approximates, all far below 1 % of the parameters (``unmodelled`` reports them per
file, with their size): Qwen2's biases on Q, K and V (``l(h + 2 h_kv)``: 129,024 parameters, 0.002 %, in
Qwen2.5-7B); Llama's optional ``attention_bias`` / ``mlp_bias``; GPT-NeoX's parallel attention and MLP
(``use_parallel_residual``: the same FLOPs, parameters and bytes, run in sequence) and rotary embedding on
``rotary_pct`` of each head (priced on whole heads, a pointwise op); sliding-window attention (Mistral; Qwen2 with
``use_sliding_window``), priced as full causal attention, which overestimates the attention core beyond the window.
MoE types: Qwen2-MoE's biases on Q, K and V and its shared expert's sigmoid gate (``h`` a block); Qwen3-MoE's RMSNorm
of each head's Q and K (``2 head_dim`` a block); DeepSeek-V3's router bias (``e_score_correction_bias``, ``E`` a block,
updated outside the gradient) and its multi-token-prediction module (``num_nextn_predict_layers``: per module one
MoE block, a ``2h x h`` projection and three RMSNorms; it shares the embedding and head); the router's auxiliary loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any

import yaml

from plansim.arguments import type_name
from plansim.errors import PlansimError, shown, shown_path
from plansim.files.yamlfile import is_dir, is_file, read_json_object, validated
from plansim.workload.families import EXPERT_KEYS, Family, HFFamily, hf_model_types
from plansim.workload.moe import block_parameters
from plansim.workload.spec import ModelSpec

__all__ = ["from_hf_config", "length_note", "model_yaml", "read_hf_config", "unmodelled"]

_MEANING = {
    "layers": "transformer blocks",
    "hidden": "model width",
    "heads": "attention heads",
    "kv_heads": "key/value heads",
    "ffn_hidden": "feed-forward width",
    "head_dim": "head width",
    "experts": "routed experts",
    "experts_per_token": "experts per token",
    "expert_ffn_hidden": "expert width",
    "shared_ffn_hidden": "shared experts' width",
    "kv_lora_rank": "key/value latent width",
    "rope_head_dim": "rotary head width",
    "v_head_dim": "value head width",
    "seq_len": "context length",
    "vocab": "vocabulary size",
}
_MAPPING = "HF config"  # how a mapping given in Python is named in messages


def read_hf_config(source: str | Path) -> dict[str, Any]:
    """The top-level JSON object of a ``config.json`` (or of ``source/config.json`` for a directory).

    Raises
    ------
    PlansimError
        One line: a missing file or directory without a config, an unreadable, oversized or non-UTF-8 file,
        malformed JSON (with line and column), nesting or duplicate keys beyond ``files.yamlfile``'s limits, or a
        top level that is not an object.
    """
    return read_json_object(
        _config_path(source), "config", "check the path (a Hugging Face config.json, or a directory holding one)"
    )


def from_hf_config(
    source: str | Path | Mapping[str, Any], *, name: str | None = None, seq_len: int | None = None
) -> ModelSpec:
    """A ``ModelSpec`` from a Hugging Face ``config.json`` of a ``model_type`` the registry maps (GPT-2, GPT-NeoX,
    Llama, Mistral, Qwen2; Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3).

    Parameters
    ----------
    source : str, Path or mapping
        The ``config.json`` file, a directory holding one, or its parsed content.
    name : str, optional
        The model's name. Default: the file's stem (its directory's name for ``config.json``); for a mapping, the
        last part of ``_name_or_path``, else the ``model_type``.
    seq_len : int, optional
        Tokens per sequence. Default: the config's context length. With a learned position table (GPT-2) at most
        that length, and the table is sized by it (as every plansim ``gpt`` model's).

    Returns
    -------
    ModelSpec

    Raises
    ------
    PlansimError
        One line naming the file and the key: an unsupported or missing ``model_type``, a missing or non-integer
        shape key, a ``head_dim`` plansim cannot express, a bad ``seq_len``, or the shape rules of ``ModelSpec``.

    Examples
    --------
    >>> config = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024,
    ...           "vocab_size": 50257}
    >>> spec = from_hf_config(config)
    >>> spec.name, spec.family, spec.ffn_hidden, spec.tied_embeddings, spec.num_parameters()
    ('gpt2', 'gpt', 3072, True, 124439808)
    >>> from_hf_config({**config, "model_type": "t5"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    plansim.errors.PlansimError: HF config: model_type 't5' is not supported: plansim reads gpt2, gpt_neox, ...
    """
    if isinstance(source, Mapping):
        config, where = dict(source), _MAPPING
    elif not isinstance(source, str | PurePath):
        raise PlansimError(
            f"source: expected a config.json path, a folder holding one or its parsed mapping, got {type_name(source)}"
        )
    else:
        config, where = read_hf_config(source), shown_path(_config_path(source))
    model_type, family, hf = _family(config, where)
    problem = hf.refuse(config) if hf.refuse is not None else None
    if problem is not None:
        raise PlansimError(f"{where}: {problem}")
    values = {
        key: _integer(config, hf_key, where, model_type, optional=_optional(hf, key, seq_len))
        for key, hf_key in hf.keys.items()
    }
    context = values.pop("seq_len", None)
    data: dict[str, Any] = {k: v for k, v in values.items() if v is not None}
    if seq_len is not None or context is not None:
        data["seq_len"] = _seq_len(seq_len, context, hf, where)
    if hf.derived is not None:
        data.update(hf.derived(config))
    if "head_dim" not in hf.keys and "head_dim" not in data:
        _check_head_dim(config, data, where)
    if family.uses("tied_embeddings"):
        data["tied_embeddings"] = _tied(config, hf, where)
    if family.uses("learned_positions"):
        data["learned_positions"] = hf.learned_positions
    data = {"name": name if name is not None else _default_name(source, config), "family": family.name, **data}
    return validated(ModelSpec, data, where)


def unmodelled(config: Mapping[str, Any], spec: ModelSpec) -> list[str]:
    """What ``spec`` leaves out of, or approximates in, the model of ``config``: one line each, with its size.

    Examples
    --------
    >>> config = {"model_type": "qwen2", "num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14,
    ...           "num_key_value_heads": 2, "intermediate_size": 4864, "max_position_embeddings": 32768,
    ...           "vocab_size": 151936, "tie_word_embeddings": True}
    >>> unmodelled(config, from_hf_config(config))
    ['biases on Q, K and V: 27,648 parameters (0.0056% of 494,005,120) not counted']
    """
    model_type = config.get("model_type")
    total, layers, h, f = spec.num_parameters(), spec.layers, spec.hidden, spec.ffn_hidden
    kv = spec.kv_heads * spec.head_dim

    def uncounted(what: str, extra: int) -> str:
        return f"{what}: {extra:,} parameters ({extra / total:.4%} of {total:,}) not counted"

    notes = []
    if model_type == "qwen2":
        notes.append(uncounted("biases on Q, K and V", layers * (h + 2 * kv)))
    if model_type in ("llama", "mistral") and config.get("attention_bias"):
        notes.append(uncounted("attention biases (attention_bias)", layers * (2 * h + 2 * kv)))
    if model_type == "llama" and config.get("mlp_bias"):
        notes.append(uncounted("MLP biases (mlp_bias)", layers * (2 * f + h)))
    if model_type == "qwen2_moe":
        notes.append(uncounted("biases on Q, K and V", layers * (h + 2 * kv)))
        if spec.shared_ffn_hidden:
            notes.append(uncounted("the shared expert's sigmoid gate", spec.moe_layers * h))
    if model_type == "qwen3_moe":
        notes.append(uncounted("RMSNorm of each head's Q and K (q_norm, k_norm)", layers * 2 * spec.head_dim))
    if model_type == "deepseek_v3":
        notes.append(uncounted("the router's bias (e_score_correction_bias, set outside the gradient)",
                               spec.moe_layers * spec.experts))  # fmt: skip
        mtp = config.get("num_nextn_predict_layers")
        if isinstance(mtp, int) and mtp > 0:
            module = block_parameters(spec) + 2 * h * h + 3 * h
            notes.append(
                uncounted(f"multi-token prediction ({mtp} module(s) of one MoE block, a 2h x h projection and three "
                          "RMSNorms; the embedding and head shared), its FLOPs a token one more MoE block and head",
                          mtp * module)
            )  # fmt: skip
    if family_of_type(model_type) == "moe":
        notes.append("the router's auxiliary load-balancing loss: a few pointwise ops over the router's scores")
    windowed = model_type in ("mistral", "mixtral") or config.get("use_sliding_window")
    window = config.get("sliding_window") if windowed else None
    if isinstance(window, int) and 0 < window < spec.seq_len:
        notes.append(
            f"sliding-window attention over {window:,} tokens: priced as full causal attention over seq_len="
            f"{spec.seq_len:,} (the attention core is overestimated)"
        )
    if model_type == "gpt_neox":
        if config.get("use_parallel_residual", True):  # GPTNeoXConfig's default
            notes.append("attention and MLP in parallel (use_parallel_residual): run in sequence, same FLOPs and bytes")
        share = config.get("rotary_pct", 0.25)  # GPTNeoXConfig's default
        if isinstance(share, (int, float)) and share < 1:
            notes.append(f"rotary embedding on {share:.0%} of each head: priced on whole heads (a pointwise op)")
    rows = config.get("n_positions")
    if model_type == "gpt2" and isinstance(rows, int) and spec.seq_len < rows:
        notes.append(
            f"the learned position table has seq_len={spec.seq_len:,} rows, the checkpoint's n_positions={rows:,}: "
            f"{(rows - spec.seq_len) * h:,} parameters fewer"
        )
    return notes


def length_note(config: Mapping[str, Any], spec: ModelSpec, seq_len: int | None = None) -> str:
    """Which sequence length ``spec`` took from ``config`` and why: the context length when ``seq_len`` (the one
    given to ``from_hf_config``, ``--seq-len``) is None, else ``seq_len``.

    Examples
    --------
    >>> config = {"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
    ...           "intermediate_size": 128, "max_position_embeddings": 131072, "vocab_size": 100}
    >>> print(length_note(config, from_hf_config(config)))
    seq_len 131,072 from max_position_embeddings (the longest context the model supports, not necessarily the \
length it was trained at): pass --seq-len (here or to simulate, plan, compare, sweep) to price another
    >>> print(length_note(config, from_hf_config(config, seq_len=4096), 4096))
    seq_len 4,096 from --seq-len (the config's max_position_embeddings is 131,072)
    """
    model_type = config.get("model_type")
    _, hf = hf_model_types()[str(model_type)]
    key = hf.keys["seq_len"]
    context = config.get(key)
    if seq_len is not None:
        said = f"{context:,}" if isinstance(context, int) and not isinstance(context, bool) else "not given"
        return f"seq_len {spec.seq_len:,} from --seq-len (the config's {key} is {said})"
    supports = "the rows of its learned position table, " if hf.learned_positions else ""
    where = "(here or to simulate, plan, compare, sweep)"
    fix = (
        f"pass --seq-len up to {spec.seq_len:,} {where} to price a shorter one"
        if hf.learned_positions
        else f"pass --seq-len {where} to price another"
    )
    return (
        f"seq_len {spec.seq_len:,} from {key} ({supports}the longest context the model supports, not necessarily the "
        f"length it was trained at): {fix}"
    )


def model_yaml(spec: ModelSpec, source: str, notes: Sequence[str] = ()) -> str:
    """``spec`` as a model YAML file (``plansim simulate --model FILE`` reads it back), headed by where it came
    from, its parameter count and ``notes`` as comments.

    >>> spec = from_hf_config({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 32,
    ...                        "vocab_size": 100})
    >>> print(model_yaml(spec, "gpt2.json"))  # doctest: +ELLIPSIS
    # gpt2: imported from gpt2.json by plansim import; 108,544 parameters.
    name: gpt2
    family: gpt
    ...
    learned_positions: true
    <BLANKLINE>
    """
    head = [f"# {spec.name}: imported from {source} by plansim import; {spec.num_parameters():,} parameters."]
    head += [f"# Not modelled: {note}" for note in notes]
    return "\n".join(head) + "\n" + yaml.safe_dump(spec.file_fields(), sort_keys=False)


def _config_path(source: str | Path) -> Path:
    path = Path(source)
    if is_dir(path):
        if not is_file(path / "config.json"):
            raise PlansimError(
                f"'{shown_path(path)}' holds no config.json: give the config file itself or the model's directory"
            )
        return path / "config.json"
    return path


def _family(config: Mapping[str, Any], where: str) -> tuple[str, Family, HFFamily]:
    """The config's ``model_type``, the family the registry maps it onto, and how its keys read."""
    known = hf_model_types()
    supported = ", ".join(known)
    model_type = config.get("model_type")
    if model_type is None:
        raise PlansimError(f"{where}: no 'model_type': add it (plansim reads {supported})")
    found = known.get(model_type) if isinstance(model_type, str) else None
    if found is None:
        raise PlansimError(
            f"{where}: model_type '{shown(model_type)}' is not supported: plansim reads {supported} "
            "(or write a model YAML)"
        )
    if "experts" not in found[1].keys:
        carried = next((key for key in EXPERT_KEYS if config.get(key)), None)
        if carried is not None:
            moe = ", ".join(t for t, (f, hf) in known.items() if "experts" in hf.keys)
            raise PlansimError(
                f"{where}: model_type '{shown(model_type)}' is dense but the config carries '{carried}' (experts): "
                f"set model_type to its mixture-of-experts type ({moe}) or remove the expert keys"
            )
    return model_type, *found


def family_of_type(model_type: object) -> str | None:
    """The plansim family a Hugging Face ``model_type`` maps onto (None: not supported)."""
    found = hf_model_types().get(model_type) if isinstance(model_type, str) else None
    return found[0].name if found is not None else None


def _optional(family: HFFamily, key: str, seq_len: int | None) -> bool:
    """Whether ``key``'s config entry may be missing: the family's optional ones, and the context length when
    ``seq_len`` is given and no learned position table needs it."""
    return key in family.optional or (key == "seq_len" and seq_len is not None and not family.learned_positions)


def _integer(config: Mapping[str, Any], key: str, where: str, model_type: str, *, optional: bool) -> int | None:
    value = config.get(key)
    if value is None:
        if optional:
            return None
        raise PlansimError(f"{where}: {model_type} config lacks '{key}' ({_meaning(model_type, key)}): add it")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlansimError(f"{where}: '{shown(key)}' must be a positive integer, got {_described(value)}")
    return value


def _described(value: object) -> str:
    """A config value as a message says it: a string as the string it is (``the string "4096"``: JSON quotes
    were what made it wrong), a boolean as the JSON literal, anything else as ``shown``.

    >>> print(_described("4096"), _described(True), _described(2.5))
    the string "4096" true 2.5
    """
    if isinstance(value, str):
        return f'the string "{shown(value)}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return shown(value)


def _meaning(model_type: str, key: str) -> str:
    _, hf = hf_model_types()[model_type]
    field_name = next(f for f, k in hf.keys.items() if k == key)
    extra = "; or give seq_len" if field_name == "seq_len" and not hf.learned_positions else ""
    return _MEANING[field_name] + extra


def _seq_len(seq_len: int | None, context: int | None, family: HFFamily, where: str) -> int:
    if seq_len is None:
        assert context is not None  # required when seq_len is not given
        return context
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise PlansimError(f"seq_len={_described(seq_len)} must be a positive integer")
    if family.learned_positions and context is not None and seq_len > context:
        raise PlansimError(
            f"seq_len={seq_len} exceeds the {context} learned positions of {where}: use at most {context}"
        )
    return seq_len


def _check_head_dim(config: Mapping[str, Any], data: Mapping[str, Any], where: str) -> None:
    head_dim, hidden, heads = config.get("head_dim"), data.get("hidden"), data.get("heads")
    if head_dim is None or not hidden or not heads or hidden % heads:
        return
    if head_dim != hidden // heads:
        raise PlansimError(
            f"{where}: head_dim={_described(head_dim)} differs from hidden_size/num_attention_heads={hidden // heads}: "
            "plansim models heads of hidden/heads width, so this model cannot be imported"
        )


def _tied(config: Mapping[str, Any], family: HFFamily, where: str) -> bool:
    tied = config.get("tie_word_embeddings")
    if tied is None:
        return family.tied
    if not isinstance(tied, bool):
        raise PlansimError(f"{where}: 'tie_word_embeddings' must be true or false, got {_described(tied)}")
    return tied


def _default_name(source: str | Path | Mapping[str, Any], config: Mapping[str, Any]) -> str:
    if isinstance(source, Mapping):
        given = str(config.get("_name_or_path") or "").rstrip("/\\")
        return given.replace("\\", "/").rsplit("/", 1)[-1] or str(config["model_type"])
    path = _config_path(source).resolve()
    return path.parent.name if path.stem == "config" else path.stem
