"""The one exception type for bad input.

A ``PlansimError`` is a user's mistake (unknown name, malformed file, impossible strategy). Its message is one line
that names the field and the fix; the CLI prints it and exits with code 2. Anything else is a bug.
"""

from __future__ import annotations

__all__ = ["PlansimError", "format_validation_error"]


class PlansimError(ValueError):
    """Bad input, with a message that names the field and the fix."""


#: pydantic error types of a number outside its range -> the words to use (None: pydantic's own, which names the
#: bound); the message then points to the table of limits.
_OUT_OF_RANGE: dict[str, str | None] = {
    "greater_than": None,
    "greater_than_equal": None,
    "less_than": None,
    "less_than_equal": None,
    "int_parsing_size": "too large a number",  # schemas read whole floats first (plansim.limits.integral)
    "finite_number": None,
}


def format_validation_error(source: str, err: object) -> str:
    """Turn a pydantic ``ValidationError`` into one line naming ``source`` and each bad field.

    >>> from pydantic import BaseModel, ConfigDict, ValidationError
    >>> class M(BaseModel):
    ...     model_config = ConfigDict(extra="forbid")
    ...     layers: int
    >>> try:
    ...     M.model_validate({"layers": "x", "colour": 1})
    ... except ValidationError as e:
    ...     print(format_validation_error("m.yaml", e))
    m.yaml: field 'layers': Input should be a valid integer, unable to parse string as an integer; field 'colour': \
unknown key (remove it or check its spelling)
    """
    parts = []
    for e in err.errors():  # type: ignore[attr-defined]
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        msg = "unknown key (remove it or check its spelling)" if e["type"] == "extra_forbidden" else e["msg"]
        if e["type"] == "missing":
            msg = "required key is missing (add it)"
        if e["type"] in _OUT_OF_RANGE:
            msg = f"{_OUT_OF_RANGE[e['type']] or msg} (plansim's limits: docs/limits.md)"
        parts.append(f"field '{loc}': {msg}")
    return f"{source}: " + "; ".join(parts)
