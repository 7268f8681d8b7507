"""Checks of the public API's arguments at the boundary: each bad argument is one ``PlansimError`` naming it (by the
CLI's option name, so a Python call and a command get the same message), before any work. Numbers are checked
against ``plansim.limits``; these check the kinds of the other arguments: a choice, a flag, names (one string is
one name), a mapping, a name or a path, a callback.

>>> names(("node0/nic0"), "failed_links (--fail-link)")  # one string is one name, not a list of characters
('node0/nic0',)
>>> choice("fast", ("step_time", "tokens_per_s"), "--objective")
Traceback (most recent call last):
...
plansim.errors.PlansimError: --objective fast: choose one of step_time, tokens_per_s
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from plansim.errors import PlansimError, shown

__all__ = ["callback", "choice", "flag", "mapping", "name_or_path", "names", "type_name"]


def type_name(value: object) -> str:
    """What ``value`` is, for a message: ``None``, ``a dict``, ``the int 3``."""
    if value is None:
        return "None"
    kind = type(value).__name__
    if isinstance(value, int | float | str):
        return f"the {kind} {shown(repr(value))}"
    return f"a {kind}"


def choice(value: object, choices: Collection[str], name: str, *, quoted: bool = False) -> str:
    """``value`` if it is one of ``choices`` (``quoted``: the message reads ``mode 'x' is unknown: ...``)."""
    if not isinstance(value, str) or value not in choices:
        said = f"{name} {shown(repr(value))} is unknown" if quoted else f"{name} {shown(value)}"
        raise PlansimError(f"{said}: choose one of {', '.join(choices)}")
    return value


def flag(value: object, name: str) -> bool:
    """``value`` if it is a bool (numpy's too)."""
    if type(value).__name__ not in ("bool", "bool_"):
        raise PlansimError(f"{name}: expected True or False, got {type_name(value)}")
    return bool(value)


def names(value: object, name: str) -> tuple[str, ...]:
    """A sequence of strings as a tuple; one string is one name (not its characters); None is none."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Mapping) or not isinstance(value, list | tuple | set | frozenset):
        raise PlansimError(f"{name}: expected a string or a list of strings, got {type_name(value)}")
    bad = [v for v in value if not isinstance(v, str)]
    if bad:
        raise PlansimError(f"{name}: expected strings, got {type_name(bad[0])}")
    return tuple(value)


def mapping(value: object, name: str) -> Mapping[Any, Any]:
    """``value`` if it is a mapping; None is an empty one."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PlansimError(f"{name}: expected a mapping such as {{key: value}}, got {type_name(value)}")
    return value


def name_or_path(value: object, name: str, what: str) -> str | Path:
    """``value`` if it is a non-empty name or a path (``what`` says which kind of thing it names)."""
    if isinstance(value, Path):
        return value
    if not isinstance(value, str) or not value.strip():
        raise PlansimError(f"{name}: expected {what}, got {type_name(value)}")
    return value


def callback(value: object, name: str) -> Callable[..., Any] | None:
    """``value`` if it is callable or None."""
    if value is not None and not callable(value):
        raise PlansimError(f"{name}: expected a function (or None), got {type_name(value)}")
    return value
