"""Loading models: preset names, model YAML files, Hugging Face ``config.json`` files, and torch modules (traced).

This module sits above the model schema (``plansim.workload.spec``) and the readers it dispatches to
(``hf_config``, ``torch_trace``), so none of them imports another in a circle.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from plansim.errors import PlansimError, shown, shown_path
from plansim.files.yamlfile import is_dir, looks_like_path, read_mapping, validated
from plansim.limits import number, whole
from plansim.workload.families import FAMILIES
from plansim.workload.spec import ModelSpec
from plansim.workload.torch_trace import TracedModel

if TYPE_CHECKING:
    from plansim.workload.traced import Workload

__all__ = ["list_models", "load_model", "preset_dir", "with_moe_imbalance", "with_seq_len"]


def preset_dir() -> Path:
    """The directory of the bundled model presets (``plansim/workload/presets``)."""
    return Path(__file__).resolve().parent / "presets"


def _preset_paths() -> dict[str, Path]:
    return {p.stem.lower(): p for p in sorted(preset_dir().glob("*.yaml"))}


def _load_file(path: Path) -> ModelSpec:
    data = read_mapping(path, "model", hint="check the path or use a preset name")
    return validated(ModelSpec, data, shown_path(path))


def _is_hf_config(name_or_path: str | Path) -> bool:
    """Whether ``name_or_path`` means a Hugging Face config: a ``.json`` file, or a directory (holding one)."""
    path = Path(name_or_path)
    return path.suffix.lower() == ".json" or is_dir(path)


@overload
def load_model(name_or_path: str | Path) -> ModelSpec: ...


@overload
def load_model(
    name_or_path: Any,
    *,
    inputs: Any,
    name: str | None = None,
    loss: Callable[[Any], Any] | None = None,
    blocks: str | None = None,
) -> TracedModel: ...


def load_model(
    name_or_path: Any,
    *,
    inputs: Any = None,
    name: str | None = None,
    loss: Callable[[Any], Any] | None = None,
    blocks: str | None = None,
) -> ModelSpec | TracedModel:
    """Load a model by preset name (case-insensitive), from a YAML file with the keys of ``ModelSpec``, or from a
    Hugging Face ``config.json``; or trace a ``torch.nn.Module``.

    Parameters
    ----------
    name_or_path : str, Path or torch.nn.Module
        A preset name such as ``"gpt3-175b"``; a path (anything ending in ``.yaml``/``.yml`` or containing a
        path separator, or any ``Path``); or a Hugging Face ``config.json`` (anything ending in ``.json``, or a
        directory holding one), read by ``plansim.workload.hf_config.from_hf_config`` with its defaults. Or a
        module, traced on the meta device by ``plansim.workload.torch_trace.trace_module`` (needs torch).
    inputs, name, loss, blocks : optional
        A module only, passed to ``trace_module``: ``inputs`` (required) are one micro-batch's example inputs
        (shapes, ``(shape, dtype)`` pairs or tensors), e.g. ``((8, 1024), torch.long)`` for token ids.

    Returns
    -------
    ModelSpec or TracedModel
        A ``TracedModel`` for a module; ``plansim.simulate`` prices it with tp=1 and its traced batch as the
        micro-batch (``plansim.workload.traced``).

    Raises
    ------
    PlansimError
        One line naming the unknown preset (and the known ones), the missing or malformed file, or the file and
        field that break the schema or the shape rules.

    Examples
    --------
    >>> load_model("GPT3-175B").layers
    96
    >>> load_model("gpt5")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    plansim.errors.PlansimError: unknown model 'gpt5': known models are deepseek-v3, gpt3-1.3b, ...
    """
    if not isinstance(name_or_path, str | Path):
        if inputs is None:
            raise PlansimError(
                f"model: got {type(name_or_path).__name__}: give a preset name, a model YAML or config.json path, "
                "or a torch.nn.Module with inputs= (one micro-batch's example input shapes)"
            )
        from plansim.workload.torch_trace import trace_module

        return trace_module(name_or_path, inputs, name=name, loss=loss, blocks=blocks)
    if inputs is not None or name is not None or loss is not None or blocks is not None:
        raise PlansimError(
            f"inputs, name, loss, blocks: only a torch.nn.Module is traced, '{shown(name_or_path)}' is a model name "
            "or path: leave them out"
        )
    if isinstance(name_or_path, Path) or looks_like_path(name_or_path) or name_or_path.lower().endswith(".json"):
        if _is_hf_config(name_or_path):
            from plansim.workload.hf_config import from_hf_config

            return from_hf_config(name_or_path)
        return _load_file(Path(name_or_path))
    presets = _preset_paths()
    path = presets.get(name_or_path.strip().lower())
    if path is None:
        known = ", ".join(sorted(presets))
        raise PlansimError(
            f"unknown model '{shown(name_or_path)}': known models are {known} (or give a model YAML file or a "
            "Hugging Face config.json)"
        )
    return _load_file(path)


def list_models() -> list[dict[str, Any]]:
    """The bundled presets as rows for ``plansim models``, ordered by family (the registry's order) and then size.

    Returns
    -------
    list of dict
        Keys ``name``, ``family``, ``layers``, ``hidden``, ``heads``, ``seq_len``, ``parameters`` (total, an
        int) and ``active_parameters`` (those one token runs through: the total but for mixture-of-experts models).

    Examples
    --------
    >>> rows = list_models()
    >>> [r["parameters"] for r in rows if r["name"] == "llama2-7b"]
    [6738415616]
    """
    specs = [_load_file(path) for path in _preset_paths().values()]
    order = list(FAMILIES)
    specs.sort(key=lambda s: (order.index(s.family), s.num_parameters()))
    return [
        {
            "name": s.name,
            "family": s.family,
            "layers": s.layers,
            "hidden": s.hidden,
            "heads": s.heads,
            "seq_len": s.seq_len,
            "parameters": s.num_parameters(),
            "active_parameters": s.active_parameters(),
        }
        for s in specs
    ]


@overload
def with_seq_len(model: ModelSpec, seq_len: int | None, option: str = ...) -> ModelSpec: ...


@overload
def with_seq_len(model: TracedModel, seq_len: int | None, option: str = ...) -> TracedModel: ...


def with_seq_len(model: Workload, seq_len: int | None, option: str = "--seq-len") -> Workload:
    """``model`` trained at ``seq_len`` tokens per sequence: a copy of its spec with that ``seq_len`` (``model``
    itself when ``seq_len`` is None or its own). The one place a run's sequence length reaches the model
    (``plansim.api`` calls it); every engine, the planner, compare and sweep read the copy's ``seq_len``.

    A learned position table (``learned_positions``: GPT-2, GPT-3) has ``seq_len`` rows, as every plansim ``gpt``
    model's (``ModelSpec.num_parameters``): a shorter length sizes it down as ``plansim import --seq-len`` does, a
    longer one is refused, since it would price a model with a larger table than the one given. A traced module
    is its graph at the traced shapes: only its own length is accepted. ``option`` names the value in messages.

    Raises
    ------
    PlansimError
        One line naming ``option``: a length outside ``plansim.limits`` (``seq_len``), a model without sequences
        (``cnn``), a traced module at another length, or a learned position table shorter than ``seq_len``.

    Examples
    --------
    >>> spec = load_model("llama2-7b")
    >>> with_seq_len(spec, 16384).seq_len, spec.seq_len
    (16384, 4096)
    >>> with_seq_len(load_model("gpt3-125m"), 4096)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    plansim.errors.PlansimError: --seq-len 4096: gpt3-125m has a learned position table of 2,048 rows ...
    """
    if seq_len is None:
        return model
    n = whole(seq_len, "seq_len", option)
    if n == model.seq_len:
        return model
    if isinstance(model, TracedModel):
        at = f"seq_len {model.seq_len:,} (its token input's second dimension)" if model.seq_len > 1 else "its inputs"
        raise PlansimError(
            f"{option} {n}: '{model.name}' is a traced module, its graph fixed at {at}: trace it again with "
            f"inputs of {n:,} tokens, or leave {option} out"
        )
    if not FAMILIES[model.family].uses("seq_len"):
        raise PlansimError(
            f"{option} {n}: {model.family} models have no sequence length ('{model.name}'): leave {option} out"
        )
    if model.learned_positions and n > model.seq_len:
        raise PlansimError(
            f"{option} {n}: {model.name} has a learned position table of {model.seq_len:,} rows (its seq_len): "
            f"use at most {model.seq_len}, or a model file with seq_len: {n} (a table of {n:,} rows, "
            f"{(n - model.seq_len) * model.hidden:,} more parameters)"
        )
    return model.model_copy(update={"seq_len": n})


@overload
def with_moe_imbalance(model: ModelSpec, imbalance: object, option: str = ...) -> ModelSpec: ...


@overload
def with_moe_imbalance(model: TracedModel, imbalance: object, option: str = ...) -> TracedModel: ...


def with_moe_imbalance(model: Workload, imbalance: object, option: str = "--moe-imbalance") -> Workload:
    """``model`` with its router's ``moe_imbalance`` set: a copy of its spec (``model`` itself when ``imbalance`` is
    None or its own). The one place a run's imbalance reaches the model (``plansim.api.run_model``), as
    ``with_seq_len`` is for the length; what it costs is the MoE layer's (``plansim.workload.moe.Routing``).

    Raises
    ------
    PlansimError
        One line naming ``option``: a value outside ``plansim.limits`` (below 1: the busiest rank receives at least
        the mean) or a model without routed experts.

    Examples
    --------
    >>> with_moe_imbalance(load_model("mixtral-8x7b"), 1.3).moe_imbalance
    1.3
    >>> with_moe_imbalance(load_model("llama2-7b"), 1.3)
    Traceback (most recent call last):
    ...
    plansim.errors.PlansimError: --moe-imbalance 1.3: 'llama2-7b' is a llama model, without routed experts to \
balance: leave --moe-imbalance out
    """
    if imbalance is None:
        return model
    x = number(imbalance, "moe_imbalance", option)
    if isinstance(model, TracedModel) or not FAMILIES[model.family].uses("moe_imbalance"):
        kind = "a traced module" if isinstance(model, TracedModel) else f"a {model.family} model"
        raise PlansimError(
            f"{option} {shown(x)}: '{model.name}' is {kind}, without routed experts to balance: leave {option} out"
        )
    if x == model.moe_imbalance:
        return model
    return model.model_copy(update={"moe_imbalance": x})
