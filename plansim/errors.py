"""The one exception type for bad input, and the helpers that keep its message one short line.

A ``PlansimError`` is a user's mistake (unknown name, malformed file, impossible strategy). Its message is one line
that names the field and the fix; the CLI prints it and exits with code 2. Anything else is a bug.

A value the user gave is echoed back through ``shown`` (``quoted`` for values of any type, ``shown_path`` for a file
name, which keeps its end): control characters escaped, cut to ``SHOWN_CHARS`` (40) characters, so that a
5,000-character or multi-line value cannot break the one line. ``format_validation_error`` turns a pydantic error into
one line naming the file and the first few bad fields.
"""

from __future__ import annotations

import math
import re
import reprlib
from pathlib import PurePath

__all__ = ["PlansimError", "format_validation_error", "quoted", "shown", "shown_path"]

#: How many characters of a user's value a message echoes (``shown``'s default).
SHOWN_CHARS = 40
#: How many of a validation error's problems ``format_validation_error`` lists before "and N more".
SHOWN_PROBLEMS = 5

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 2, 4, 4, 4, 4
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = SHOWN_CHARS


class PlansimError(ValueError):
    """Bad input, with a message that names the field and the fix."""


def _escaped(text: str) -> str:
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``value`` as one short line for a message: a string as it is, anything else as a (bounded) ``repr``; control
    characters (newlines, tabs, NUL) escaped; cut to ``limit`` characters ending in ``...``.

    >>> shown("dp=8"), shown("a\\nb"), shown("x" * 100, 10), shown([1, 2, 3, 4, 5, 6])
    ('dp=8', 'a\\\\nb', 'xxxxxxx...', '[1, 2, 3, 4, ...]')
    """
    if isinstance(value, str):
        text = value
    else:
        try:
            text = _REPR.repr(value)
        except ValueError:  # an int of more than 4,300 digits has no repr
            digits = int(value.bit_length() * math.log10(2)) + 1 if isinstance(value, int) else 0
            text = f"(a number of {digits:,} digits)" if digits else f"<{type(value).__name__} too large to print>"
    cut = _escaped(text[: limit + 1])
    if len(text) > limit or len(cut) > limit:
        return cut[: max(limit - 3, 1)] + "..."
    return cut


def quoted(value: object, limit: int = SHOWN_CHARS) -> str:
    """``shown``, with a string in quotes (as ``repr`` would show it): for messages that echo values of any type.

    >>> print(quoted("leaf0"), quoted(3), quoted("x" * 50, 10))
    'leaf0' 3 'xxxxxxx...'
    """
    return f"'{shown(value, limit)}'" if isinstance(value, str) else shown(value, limit)


def shown_path(path: str | PurePath, limit: int = 2 * SHOWN_CHARS) -> str:
    """A file name for a message: ``shown``, but a long one keeps its end (the file's own name).

    >>> shown_path("/a/" + "b" * 100 + "/model.yaml", 20)
    '...bbbbbb/model.yaml'
    """
    text = str(path)
    if len(text) <= limit:
        return shown(text, limit)
    tail = _escaped(text[-limit:])
    return "..." + tail[-(limit - 3) :]


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
    """Turn a pydantic ``ValidationError`` into one line naming ``source`` and each bad field (the first few).

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
    errors = err.errors()  # type: ignore[attr-defined]
    parts = []
    for e in errors[:SHOWN_PROBLEMS]:
        loc = shown(".".join(str(x) for x in e["loc"]), 2 * SHOWN_CHARS) or "(top level)"
        msg = "unknown key (remove it or check its spelling)" if e["type"] == "extra_forbidden" else e["msg"]
        if e["type"] == "missing":
            msg = "required key is missing (add it)"
        if e["type"] == "value_error":  # a validator's own message: pydantic prefixes "Value error, "
            msg = str(e["msg"]).removeprefix("Value error, ")
        if e["type"] in _OUT_OF_RANGE:
            msg = f"{_OUT_OF_RANGE[e['type']] or msg} (plansim's limits: docs/limits.md)"
        parts.append(f"field '{loc}': {shown(msg, 8 * SHOWN_CHARS)}")
    if len(errors) > SHOWN_PROBLEMS:
        parts.append(f"and {len(errors) - SHOWN_PROBLEMS} more")
    return f"{source}: " + "; ".join(parts)
