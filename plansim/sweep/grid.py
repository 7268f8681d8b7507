"""The sweep's grid: models x hardware x GPU counts x global batches, from comma-separated lists or a YAML file,
and optionally x sequence lengths (``seq_len``: each model priced at each length instead of its own).

A grid is checked before anything runs: every model and node type is loaded once (an unknown name or a bad file
ends the sweep in one line), every GPU count, batch and length is a positive whole number within its range, and no
value is listed twice. A GPU count that a node type cannot be sized to (not a whole number of nodes), or a length a
model cannot take (a learned position table too short, a model without sequences:
``plansim.workload.with_seq_len``) is not a grid error: that point's row says why it did not run, as a point where
nothing fits does.

Points are numbered in grid order (model outermost, then sequence length, hardware, GPU count, global batch); the
sweep's rows follow that order whichever executor ran them.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, field_validator

from plansim.errors import PlansimError, quoted, shown, shown_path
from plansim.files.yamlfile import read_mapping, validated
from plansim.hardware import Cluster, load_hardware
from plansim.limits import whole
from plansim.workload import ModelSpec, load_model

__all__ = ["GridFile", "Point", "SweepGrid", "grid_from_options", "load_grid", "parse_grid"]

#: The node type a grid without ``--hardware`` uses (as ``plansim plan`` does).
DEFAULT_HARDWARE = "dgx-a100"


@dataclass(frozen=True)
class Point:
    """One planner run: its position in grid order, the model and one node of the node type (resized to ``gpus``
    where it runs, so a worker needs neither file), the GPU count, the global batch and the sequence length the
    model is priced at (None: its own; ``plan(seq_len=)`` applies it)."""

    index: int
    model: ModelSpec
    node: Cluster
    gpus: int
    global_batch: int
    seq_len: int | None = None


@dataclass(frozen=True)
class SweepGrid:
    """The values of each dimension, in the order given; ``points()`` is their product in grid order. ``seq_lens``
    empty (the default) prices each model at its own sequence length."""

    models: tuple[str, ...]
    hardware: tuple[str, ...]
    gpus: tuple[int, ...]
    global_batches: tuple[int, ...]
    seq_lens: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("models", "hardware", "gpus", "global_batches", "seq_lens"):  # one value is a list of one
            value = getattr(self, name)
            if isinstance(value, str | int):
                object.__setattr__(self, name, (value,))
            elif isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        for option, values in zip(_OPTIONS, self._values(), strict=True):
            _check_values(option, values, f"{option} {_EXAMPLES[option]}", _NUMERIC.get(option))
        if self.seq_lens:
            _check_values("--seq-len", self.seq_lens, f"--seq-len {_EXAMPLES['--seq-len']}", "seq_len")

    def _values(self) -> tuple[Sequence[Any], ...]:
        return self.models, self.hardware, self.gpus, self.global_batches

    def __len__(self) -> int:
        sizes = (len(self.models), max(1, len(self.seq_lens)), len(self.hardware), len(self.gpus))
        return sizes[0] * sizes[1] * sizes[2] * sizes[3] * len(self.global_batches)

    def at_seq_len(self, seq_len: int | None) -> SweepGrid:
        """The grid with every model at ``seq_len`` (``plansim.sweep.sweep(seq_len=)``, ``--seq-len`` beside a grid
        file): itself where ``seq_len`` is None or its only length; a grid with other lengths is refused.

        >>> SweepGrid(("gpt3-125m",), ("dgx-a100",), (8,), (64,)).at_seq_len(1024).seq_lens
        (1024,)
        """
        if seq_len is None:
            return self
        n = whole(seq_len, "seq_len", "--seq-len")
        if self.seq_lens and self.seq_lens != (n,):
            lengths = ",".join(map(str, self.seq_lens))
            raise PlansimError(
                f"--seq-len {n} and the grid's seq_len {lengths} differ: give the lengths once, or make them agree"
            )
        return dataclasses.replace(self, seq_lens=(n,))

    def points(self) -> list[Point]:
        """Every (model, sequence length, hardware, GPUs, global batch), model outermost; loads each model and node
        type once.

        >>> grid = SweepGrid(("gpt3-125m",), ("dgx-a100", "dgx-h100"), (8, 16), (64,))
        >>> [(p.index, p.node.name, p.gpus) for p in grid.points()]
        [(0, 'dgx-a100', 8), (1, 'dgx-a100', 16), (2, 'dgx-h100', 8), (3, 'dgx-h100', 16)]
        >>> lengths = SweepGrid(("gpt3-125m",), ("dgx-a100",), (8, 16), (64,), seq_lens=(512, 1024))
        >>> [(p.seq_len, p.gpus) for p in lengths.points()]
        [(512, 8), (512, 16), (1024, 8), (1024, 16)]
        """
        models = [load_model(m) for m in self.models]
        nodes = [load_hardware(h) for h in self.hardware]
        lengths: tuple[int | None, ...] = self.seq_lens or (None,)
        product = itertools.product(models, lengths, nodes, self.gpus, self.global_batches)
        return [Point(k, m, n, g, b, s) for k, (m, s, n, g, b) in enumerate(product)]

    def describe(self) -> str:
        """One line: the values of each dimension and the number of points.

        >>> SweepGrid(("gpt3-125m",), ("dgx-a100",), (8, 16), (64, 128)).describe()
        '1 model x 1 hardware x 2 GPU counts x 2 global batches = 4 points'
        >>> SweepGrid(("gpt3-125m",), ("dgx-a100",), (8,), (64,), (512, 1024)).describe()
        '1 model x 2 sequence lengths x 1 hardware x 1 GPU count x 1 global batch = 2 points'
        """
        lengths = f" x {_count(len(self.seq_lens), 'sequence length')}" if self.seq_lens else ""
        return (
            f"{_count(len(self.models), 'model')}{lengths} x {len(self.hardware)} hardware x "
            f"{_count(len(self.gpus), 'GPU count')} x {_count(len(self.global_batches), 'global batch')} "
            f"= {_count(len(self), 'point')}"
        )

    def as_dict(self) -> dict[str, list[Any]]:
        """The grid as the YAML file's keys (``seq_len`` only where the grid gives lengths)."""
        return {
            "model": list(self.models),
            "hardware": list(self.hardware),
            "gpus": list(self.gpus),
            "global_batch": list(self.global_batches),
            **({"seq_len": list(self.seq_lens)} if self.seq_lens else {}),
        }


def _count(n: int, noun: str) -> str:
    plural = noun + ("es" if noun.endswith("ch") else "s")
    return f"{n} {noun if n == 1 else plural}"


def _check_values(label: str, values: Sequence[Any], example: str, numeric: str | None) -> None:
    """Each value of one dimension (``label`` names it in the message): present, well-formed (positive whole
    numbers within ``plansim.limits.LIMITS[numeric]`` where ``numeric`` names a limit, else names), listed once."""
    if not values:
        raise PlansimError(f"{label}: give at least one value, e.g. {example}")
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise PlansimError(f"{label}: expected a list of values, e.g. {example}")
    for v in values:
        if numeric and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise PlansimError(f"{label} {quoted(v)}: expected positive whole numbers, e.g. {example}")
        if numeric:
            whole(v, numeric, label)  # the range of plansim.limits (a GPU count, a global batch)
        if not numeric and (not isinstance(v, str) or not v.strip()):
            raise PlansimError(f"{label} {quoted(v)}: expected names or YAML paths, e.g. {example}")
    seen = set()
    for v in values:
        if v in seen:
            raise PlansimError(f"{label}: {shown(v)} is listed twice: list each value once")
        seen.add(v)


#: The command line's option of each dimension, in grid order, and the YAML file's key.
_OPTIONS = ("--model", "--hardware", "--gpus", "--global-batch")
_KEYS = ("model", "hardware", "gpus", "global_batch")
_NUMERIC = {"--gpus": "gpus", "--global-batch": "global_batch"}  # option -> its range in plansim.limits
_EXAMPLES = {
    "--model": "gpt3-125m,gpt3-350m",
    "--hardware": "dgx-a100,dgx-h100",
    "--gpus": "8,16,32",
    "--global-batch": "64,128",
    "--seq-len": "2048,4096",
}


def parse_grid(
    model: str, gpus: str, global_batch: str, hardware: str | None = None, seq_len: str | None = None
) -> SweepGrid:
    """The grid from the command line's comma-separated lists (``--hardware`` defaults to dgx-a100, ``--seq-len``
    to each model's own length).

    >>> parse_grid("gpt3-125m,gpt3-350m", "8,16", "64").describe()
    '2 models x 1 hardware x 2 GPU counts x 1 global batch = 4 points'
    >>> parse_grid("gpt3-125m", "8,x", "64")
    Traceback (most recent call last):
    ...
    plansim.errors.PlansimError: --gpus 8,x: expected positive whole numbers, e.g. --gpus 8,16,32
    >>> parse_grid("gpt3-125m", "8", "64", seq_len="1024,0")
    Traceback (most recent call last):
    ...
    plansim.errors.PlansimError: --seq-len 0: expected positive whole numbers, e.g. --seq-len 2048,4096
    """
    return SweepGrid(
        tuple(_names(model)),
        tuple(_names(hardware if hardware is not None else DEFAULT_HARDWARE)),
        tuple(_numbers("--gpus", gpus)),
        tuple(_numbers("--global-batch", global_batch)),
        () if seq_len is None else tuple(_numbers("--seq-len", seq_len, empty=True)),
    )


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _numbers(option: str, text: str, *, empty: bool = False) -> list[int]:
    """The whole numbers of a comma-separated list; with ``empty``, a list of none is refused here (a grid's
    optional dimension would otherwise take it as left out)."""
    parts = _names(text)
    if empty and not parts:
        raise PlansimError(f"{option}: give at least one value, e.g. {option} {_EXAMPLES[option]}")
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise PlansimError(
            f"{option} {shown(text)}: expected positive whole numbers, e.g. {option} {_EXAMPLES[option]}"
        ) from None


def grid_from_options(
    model: str | None,
    gpus: str | None,
    global_batch: str | None,
    hardware: str | None,
    grid_file: str | None,
    seq_len: str | None = None,
) -> SweepGrid:
    """The grid of ``plansim sweep``: the YAML file ``grid_file``, or the lists (``--model``, ``--gpus`` and
    ``--global-batch`` needed), not both. ``--seq-len`` goes with either: beside a grid file that gives
    ``seq_len`` too, the two must agree.

    >>> grid_from_options("gpt3-125m", None, "64", None, None)
    Traceback (most recent call last):
    ...
    plansim.errors.PlansimError: --gpus: needed (or a grid file, --grid FILE), e.g. --gpus 8,16,32
    """
    lists = {"--model": model, "--gpus": gpus, "--global-batch": global_batch, "--hardware": hardware}
    if grid_file is not None:
        given = [k for k, v in lists.items() if v is not None]
        if given:
            raise PlansimError(f"--grid and {'/'.join(given)}: give the grid file or the lists, not both")
        from_file = load_grid(grid_file)
        if seq_len is None:
            return from_file
        lengths = dataclasses.replace(from_file, seq_lens=tuple(_numbers("--seq-len", seq_len, empty=True)))
        if from_file.seq_lens and from_file.seq_lens != lengths.seq_lens:
            raise PlansimError(
                f"--seq-len {seq_len} and seq_len {','.join(map(str, from_file.seq_lens))} in {grid_file} differ: "
                "give the lengths once, or make them agree"
            )
        return lengths
    missing = [k for k, v in lists.items() if v is None and k != "--hardware"]
    if missing:
        example = " ".join(f"{k} {_EXAMPLES[k]}" for k in missing)
        raise PlansimError(f"{', '.join(missing)}: needed (or a grid file, --grid FILE), e.g. {example}")
    assert model is not None and gpus is not None and global_batch is not None
    return parse_grid(model, gpus, global_batch, hardware, seq_len)


class GridFile(BaseModel):
    """A sweep grid file: each key one value or a list of them; ``hardware`` defaults to dgx-a100, ``seq_len`` to
    each model's own length.

    ``model: [gpt3-125m, gpt3-350m]``, ``hardware: [dgx-a100, dgx-h100]``, ``gpus: [8, 16, 32]``,
    ``global_batch: [64, 128]``, ``seq_len: [2048, 4096]``.
    """

    model_config = ConfigDict(extra="forbid")

    model: list[StrictStr]
    hardware: list[StrictStr] = [DEFAULT_HARDWARE]
    gpus: list[StrictInt]
    global_batch: list[StrictInt]
    seq_len: list[StrictInt] | None = None

    @field_validator("model", "hardware", "gpus", "global_batch", "seq_len", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return value if isinstance(value, list) else [value]


def load_grid(path: str | Path) -> SweepGrid:
    """The grid of a YAML file (keys of ``GridFile``); a bad file or field is one line naming both."""
    source = Path(path)
    data = validated(
        GridFile, read_mapping(source, "sweep grid", "give the path of a YAML grid file"), shown_path(source)
    )
    values: tuple[list[Any], ...] = (data.model, data.hardware, data.gpus, data.global_batch)
    numeric = {**_NUMERIC, "--seq-len": "seq_len"}
    if data.seq_len is not None:  # given, even as an empty list (refused: at least one value)
        values += (data.seq_len,)
    for key, option, listed in zip((*_KEYS, "seq_len"), (*_OPTIONS, "--seq-len"), values, strict=False):
        example = "[" + _EXAMPLES[option].replace(",", ", ") + "]"
        _check_values(f"{source}: field '{key}'", listed, f"{key}: {example}", numeric.get(option))
    return SweepGrid(
        tuple(data.model), tuple(data.hardware), tuple(data.gpus), tuple(data.global_batch), tuple(data.seq_len or ())
    )
