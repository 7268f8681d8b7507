"""Reading the data files (model, hardware, strategy, grid and profile YAML; ``config.json``; graph files): one
reader, one set of limits, one set of messages.

Any bytes in, one line out: every failure is a ``PlansimError`` of one line naming the file, the problem and the fix.
The limits, checked before any value is built:

- size: at most ``MAX_FILE_BYTES`` (1 MiB; the shipped files are under 4 KB), read no further than that;
- encoding: UTF-8 (a leading byte-order mark is allowed); otherwise the offset of the first bad byte;
- nesting: at most ``MAX_DEPTH`` (64) levels of mappings and lists, YAML aliases counted where they point;
- YAML aliases: at most ``MAX_VALUES`` (100,000) values once every alias is expanded, and no alias inside its own
  anchor (a "billion laughs" file is refused, not expanded);
- keys: a key given twice in one mapping (YAML) or object (JSON) is refused, not silently overwritten;
- integers: at most ``MAX_DIGITS`` (4,300, Python's own limit for ``int(str)``) digits.

``read_text`` reads a file within those limits (a regular file only), ``parse_yaml`` parses YAML safely (``25e9``
read as a number; a refused value named with its line), ``parse_json`` JSON (its nesting checked before ``json``
recurses). A missing, unreadable, oversized, malformed or schema-violating file gets one message format.
``is_file`` and ``is_dir`` answer False for a name the system cannot look up.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import stat
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from plansim.errors import PlansimError, format_validation_error, shown, shown_path

__all__ = [
    "MAX_DEPTH",
    "MAX_DIGITS",
    "MAX_FILE_BYTES",
    "MAX_VALUES",
    "input_at",
    "is_dir",
    "is_file",
    "looks_like_path",
    "not_regular",
    "parse_json",
    "parse_yaml",
    "read_json_object",
    "read_mapping",
    "read_text",
    "record_input",
    "recording_inputs",
    "refuse_special",
    "validated",
]

_Model = TypeVar("_Model", bound=BaseModel)

#: Largest data file read, in bytes (1 MiB). The shipped profiles, presets and strategies are under 4 KB; the
#: pure-Python YAML parser reads about 150 KB/s on one slow core, so this bounds a parse to seconds.
MAX_FILE_BYTES = 1 << 20
#: Deepest nesting of mappings and lists (a scalar inside 63 of them is at depth 64).
MAX_DEPTH = 64
#: Most values a YAML document may hold once its aliases are expanded.
MAX_VALUES = 100_000
#: Most digits of an integer (CPython's default ``sys.get_int_max_str_digits()``).
MAX_DIGITS = 4300

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Refused(yaml.MarkedYAMLError):
    """A YAML document refused by a limit (not a syntax error): ``problem`` says which and the fix."""

    def __init__(self, problem: str, node: Node | None = None, mark: Any = None) -> None:
        super().__init__(problem=problem, problem_mark=mark if node is None else node.start_mark)


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``25e9`` and ``1.0e6`` as floats (YAML 1.1 wants ``1.0e+6``), and refuses (with a
    YAML error and its line) nesting deeper than ``MAX_DEPTH``, alias expansions beyond ``MAX_VALUES`` or into a
    cycle, duplicate keys, and scalars that cannot be built (an integer of 5,000 digits, a 13th month)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = False

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            self._aliases = True
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(f"nested deeper than {MAX_DEPTH} levels: flatten it", mark=self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_mapping_node(self, anchor: Any) -> MappingNode:
        node: MappingNode = super().compose_mapping_node(anchor)
        seen: dict[object, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == _MERGE_TAG:
                continue
            try:
                key = self.construct_object(key_node)
                first = seen.get(key)
            except (yaml.YAMLError, TypeError):
                continue  # an unbuildable or unhashable key: the constructor reports it
            if first is not None:
                raise _Refused(
                    f"duplicate key '{shown(key_node.value)}' (first at line {first + 1}): keep one of them", key_node
                )
            seen[key] = key_node.start_mark.line
        return node

    def compose_document(self) -> Node | None:
        node = super().compose_document()
        if self._aliases and node is not None:
            _check_expansion(node)
        return node

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as err:
            what = f"'{shown(node.value)}'" if isinstance(node, ScalarNode) else "a value"
            if "digits" in str(err):
                raise _Refused(f"an integer of more than {MAX_DIGITS} digits: write a smaller number", node) from None
            raise _Refused(
                f"{what} cannot be read as {node.tag.rpartition(':')[2]} ({shown(str(err), 80)})", node
            ) from None


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _check_expansion(root: Node) -> None:
    """Refuse a document whose aliases, expanded, nest deeper than ``MAX_DEPTH``, hold more than ``MAX_VALUES``
    values, or loop. Each node is walked once (its size and height memoized), the recursion is at most
    ``MAX_DEPTH`` deep."""
    memo: dict[int, tuple[int, int]] = {}
    active: set[int] = set()

    def walk(node: Node, depth: int) -> tuple[int, int]:
        key = id(node)
        if key in active:
            raise _Refused("an alias inside its own anchor (a cycle): remove the alias", node)
        if key not in memo:
            if depth > MAX_DEPTH:
                raise _Refused(f"aliases nest it deeper than {MAX_DEPTH} levels: flatten it", node)
            if isinstance(node, SequenceNode):
                children: list[Node] = list(node.value)
            elif isinstance(node, MappingNode):
                children = [n for pair in node.value for n in pair]
            else:
                children = []
            active.add(key)
            size, height = 1, 1
            for child in children:
                s, h = walk(child, depth + 1)
                size, height = size + s, max(height, h + 1)
                if size > MAX_VALUES:
                    raise _Refused(f"its aliases expand to more than {MAX_VALUES:,} values: use fewer aliases", node)
            active.discard(key)
            memo[key] = (size, height)
        size, height = memo[key]
        if depth + height - 1 > MAX_DEPTH:
            raise _Refused(f"aliases nest it deeper than {MAX_DEPTH} levels: flatten it", node)
        return size, height

    walk(root, 1)


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text safely (no Python objects are built); ``source`` names it in the error.

    >>> parse_yaml("bandwidth: 25e9", "x.yaml")
    {'bandwidth': 25000000000.0}
    >>> parse_yaml("a: 1\\na: 2", "x.yaml")
    Traceback (most recent call last):
    plansim.errors.PlansimError: x.yaml: line 2: duplicate key 'a' (first at line 1): keep one of them
    """
    try:
        return yaml.load(text, Loader=_Loader)
    except _Refused as err:
        line = err.problem_mark.line + 1 if err.problem_mark is not None else 1
        raise PlansimError(f"{source}: line {line}: {err.problem}") from None
    except yaml.reader.ReaderError as err:
        raise PlansimError(
            f"{source}: character {err.position + 1} is not allowed in YAML ({shown(err.reason)}): remove it"
        ) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise PlansimError(f"{source}: malformed YAML{where}: {shown(problem, 160)}: fix the syntax") from None
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits, 4,300 digits)
        raise PlansimError(f"{source}: a number has too many digits to read: write a smaller number") from None


def _json_too_deep(text: str) -> int | None:
    """The line where ``text``'s JSON arrays and objects first nest deeper than ``MAX_DEPTH``, or None.

    One pass over the brackets, quotes and backslashes (strings skipped), before ``json`` recurses into them.

    >>> _json_too_deep("[" * 70), _json_too_deep('{"a": "[[[["}')
    (1, None)
    """
    depth = 0
    in_string = False
    escaped_at = -1
    for m in _JSON_SYNTAX.finditer(text):
        i = m.start()
        if i == escaped_at:
            continue
        ch = text[i]
        if in_string:
            if ch == "\\":
                escaped_at = i + 1
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return text.count("\n", 0, i) + 1
        elif ch in "]}":
            depth -= 1
    return None


_JSON_SYNTAX = re.compile(r'[\\"\[\]{}]')


def parse_json(text: str, source: str) -> Any:
    """Parse JSON text; ``source`` names it in the error. Nesting, duplicate keys and huge integers are refused.

    >>> parse_json('{"layers": 2}', "c.json")
    {'layers': 2}
    >>> parse_json('{"a": 1, "a": 2}', "c.json")
    Traceback (most recent call last):
    plansim.errors.PlansimError: c.json: duplicate key 'a' in one object: keep one of them
    """
    line = _json_too_deep(text)
    if line is not None:
        raise PlansimError(f"{source}: line {line}: nested deeper than {MAX_DEPTH} levels: flatten it")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise PlansimError(f"{source}: duplicate key '{shown(key)}' in one object: keep one of them")
            out[key] = value
        return out

    def integer(digits: str) -> int:
        if len(digits.lstrip("-")) > MAX_DIGITS:
            raise PlansimError(
                f"{source}: an integer of {len(digits):,} digits ({shown(digits, 20)}): at most {MAX_DIGITS}, "
                "write a smaller number"
            )
        return int(digits)

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_int=integer)
    except json.JSONDecodeError as err:
        raise PlansimError(
            f"{source}: malformed JSON at line {err.lineno} column {err.colno}: {err.msg}: fix the syntax"
        ) from None


def not_regular(path: Path) -> str | None:
    """What ``path`` is when it exists but is not a regular file ("a FIFO", "a folder", "a device", "a socket",
    "a symlink loop"), found with ``stat`` alone (nothing is opened, so a FIFO cannot block); None for a regular
    file or a name that does not exist.

    >>> import tempfile
    >>> not_regular(Path(tempfile.gettempdir())), not_regular(Path("no-such-file.yaml"))
    ('a folder', None)
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        return "a symlink loop" if err.errno == errno.ELOOP else None
    except ValueError:  # a NUL in the name
        return None
    return _kind(mode)


def _kind(mode: int) -> str | None:
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def refuse_special(path: Path, what: str, hint: str = "check the path") -> None:
    """A one-line ``PlansimError`` when ``path`` exists but is not a regular file (``not_regular``); nothing is
    opened."""
    kind = not_regular(path)
    if kind is not None:
        raise PlansimError(f"{what} file '{shown_path(path)}' is {kind}, not a regular file: {hint}")


def read_text(path: Path, what: str, hint: str = "check the path", limit: int = MAX_FILE_BYTES) -> str:
    """The text of the ``what`` file ``path`` (UTF-8, at most ``limit`` bytes, read no further).

    Only a regular file is read: a FIFO, a device, a socket, a folder or a symlink loop is refused from its
    ``stat`` before anything is opened, and the file is opened without blocking (``O_NONBLOCK``) and checked again
    once open, so nothing that appears under the name meanwhile can make the read wait forever. The file is
    recorded as an input (``record_input``) so that no output of the same command replaces it.

    Raises
    ------
    PlansimError
        One line naming the file: not found (with ``hint``), not a regular file, unreadable, too large, or not UTF-8
        (with the offset of the first bad byte).
    """
    name = shown_path(path)
    refuse_special(path, what, hint)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        with open(fd, "rb") as f:
            kind = _kind(os.fstat(f.fileno()).st_mode)
            if kind is not None:
                raise PlansimError(f"{what} file '{name}' is {kind}, not a regular file: {hint}")
            record_input(path)
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise PlansimError(f"{what} file '{name}' not found: {hint}") from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise PlansimError(f"{what} file '{name}' is a symlink loop, not a regular file: {hint}") from None
        raise PlansimError(f"{what} file '{name}' cannot be read: {err.strerror or err}") from None
    except ValueError:  # a NUL in the path
        raise PlansimError(f"{what} file '{name}': not a valid path (it holds a NUL character): {hint}") from None
    if len(data) > limit:
        raise PlansimError(
            f"{name}: larger than {limit / 2**20:g} MiB, too large for a {what} file: check that it is the right "
            "file (these are small text files)"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise PlansimError(
            f"{name}: not UTF-8 text (byte {err.start} is 0x{data[err.start]:02x}): save it as UTF-8"
        ) from None


# -- the inputs of one command ---------------------------------------------------------------------------------------

_inputs: ContextVar[dict[tuple[int, int], Path] | None] = ContextVar("plansim_inputs", default=None)


@contextlib.contextmanager
def recording_inputs() -> Iterator[dict[tuple[int, int], Path]]:
    """Within the block, every file read (``read_text``, ``record_input``) is noted by its device and inode, so that
    ``plansim.files.outputs`` can refuse to write over it (the CLI opens one per command)."""
    token = _inputs.set({})
    try:
        yield _inputs.get() or {}
    finally:
        _inputs.reset(token)


def record_input(path: Path) -> None:
    """Note ``path`` as an input of the command being run (inside ``recording_inputs``; elsewhere nothing)."""
    seen = _inputs.get()
    if seen is None:
        return
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return
    seen[(st.st_dev, st.st_ino)] = Path(path)


def input_at(path: Path) -> Path | None:
    """The input recorded under the same file as ``path`` (the name it was read by), or None: ``path`` is not one
    of the command's inputs, or does not exist."""
    seen = _inputs.get()
    if not seen:
        return None
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return seen.get((st.st_dev, st.st_ino))


def read_mapping(path: Path, what: str, hint: str = "check the path") -> dict[str, Any]:
    """The top-level mapping of the YAML file ``path`` (a ``what`` file: "model", "strategy", ...)."""
    data = parse_yaml(read_text(path, what, hint), shown_path(path))
    if data is None:
        raise PlansimError(f"{shown_path(path)}: the file is empty: write the {what} keys as key: value lines")
    if not isinstance(data, dict):
        raise PlansimError(
            f"{shown_path(path)}: expected a mapping of {what} keys at the top level (key: value lines), "
            f"got {shown(data)}"
        )
    return data


def read_json_object(path: Path, what: str, hint: str = "check the path") -> dict[str, Any]:
    """The top-level object of the JSON file ``path`` (a ``what`` file)."""
    data = parse_json(read_text(path, what, hint), shown_path(path))
    if not isinstance(data, dict):
        raise PlansimError(
            f"{shown_path(path)}: expected a JSON object of {what} keys at the top level, got {type(data).__name__}"
        )
    return data


def validated(model: type[_Model], data: object, source: str) -> _Model:
    """``data`` checked against the schema ``model``; a violation names ``source`` and each bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise PlansimError(format_validation_error(source, err)) from None


def is_file(path: Path) -> bool:
    """``path.is_file()``, but False (not an ``OSError``) for a name the system cannot look up: too long, a NUL.

    >>> is_file(Path("x" * 5000)), is_file(Path("a\\0b"))
    (False, False)
    """
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def is_dir(path: Path) -> bool:
    """``path.is_dir()``, False for a name the system cannot look up (as ``is_file``)."""
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def looks_like_path(text: str) -> bool:
    """Whether a name given on the command line is meant as a file rather than a built-in name.

    >>> looks_like_path("gpt3-175b"), looks_like_path("my/model.yaml"), looks_like_path("m.yml")
    (False, True, True)
    """
    return text.endswith((".yaml", ".yml")) or "/" in text or "\\" in text
