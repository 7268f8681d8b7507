"""Reading the YAML data files (hardware profiles, model presets, strategies): one loader, one set of messages.

Every failure is a ``PlansimError`` of one line naming the file, the problem and the fix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from plansim.errors import PlansimError, format_validation_error

__all__ = ["looks_like_path", "parse_yaml", "read_mapping", "validated"]

_Model = TypeVar("_Model", bound=BaseModel)


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``25e9`` and ``1.0e6`` as floats (YAML 1.1 wants ``1.0e+6``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text safely (no Python objects are built); ``source`` names it in the error.

    >>> parse_yaml("bandwidth: 25e9", "x.yaml")
    {'bandwidth': 25000000000.0}
    """
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise PlansimError(f"{source}: malformed YAML{where}: {problem}: fix the syntax") from None
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits, 4,300 digits)
        raise PlansimError(f"{source}: a number has too many digits to read: write a smaller number") from None


def read_mapping(path: Path, what: str, hint: str = "check the path") -> dict[str, Any]:
    """The top-level mapping of the YAML file ``path`` (a ``what`` file: "model", "strategy", ...)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlansimError(f"{what} file '{path}' not found: {hint}") from None
    except OSError as err:
        raise PlansimError(f"{what} file '{path}' cannot be read: {err.strerror}") from None
    data = parse_yaml(text, str(path))
    if not isinstance(data, dict):
        raise PlansimError(f"{path}: expected a mapping of {what} keys at the top level, got {data!r:.40}")
    return data


def validated(model: type[_Model], data: object, source: str) -> _Model:
    """``data`` checked against the schema ``model``; a violation names ``source`` and each bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise PlansimError(format_validation_error(source, err)) from None


def looks_like_path(text: str) -> bool:
    """Whether a name given on the command line is meant as a file rather than a built-in name.

    >>> looks_like_path("gpt3-175b"), looks_like_path("my/model.yaml"), looks_like_path("m.yml")
    (False, True, True)
    """
    return text.endswith((".yaml", ".yml")) or "/" in text or "\\" in text
