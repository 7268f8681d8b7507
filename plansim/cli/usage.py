"""Usage errors of the ``plansim`` command line as one line on stderr, exit code 2.

An option of the wrong type, a missing option or option value, an unknown option or command, a bad choice: typer
(click) would print the usage, a hint and a boxed error panel. ``OneLineGroup``, the app's group class, runs the
command line in click's non-standalone mode and prints the error as one line naming the command, the option and the
fix instead, e.g.::

    plansim simulate: --gpus: 'abc' is not a valid integer: give a whole number, e.g. --gpus 8

``--help``, the commands' output and their own errors (``PlansimError``, printed by ``cli.app._clear_errors``) are
unchanged. A value echoed back is cut short (``plansim.errors.shown``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from enum import Enum
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from plansim.errors import shown

__all__ = ["OneLineGroup", "usage_line"]

# click's exception base. typer >= 0.29 carries its own copy of click (``typer._click``), older typer uses click: in
# both, typer.BadParameter derives from a class named ClickException, the base of every error click prints.
_CLICK_EXCEPTION: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _is(err: BaseException, name: str) -> bool:
    """Whether ``err`` is (a subclass of) click's exception class ``name`` (typer's copy or click's own)."""
    return any(c.__name__ == name for c in type(err).__mro__)


def _option(param: Any) -> str:
    """How the user writes ``param``: its longest option name (``--gpus``), or an argument's metavar."""
    opts = list(getattr(param, "opts", None) or ())
    if opts and getattr(param, "param_type_name", "") == "option":
        return max(opts, key=len)
    name = getattr(param, "metavar", None) or getattr(param, "name", None) or "value"
    return str(name).upper()


def _choices(param: Any) -> list[str]:
    """The values a choice parameter takes (typer's type descriptor, or click's Choice type); [] otherwise."""
    desc = getattr(param, "type_descriptor", None)
    values = getattr(desc, "choices", None) if getattr(desc, "is_choice", False) else None
    if values is None:
        values = getattr(getattr(param, "type", None), "choices", None)
    return [str(v.value if isinstance(v, Enum) else v) for v in values or ()]


def _kind(message: str) -> str:
    """What a conversion error says the value should have been: "integer", "number", "boolean" or ""."""
    text = message.lower()
    for word, kind in (("integer", "integer"), ("float", "number"), ("number", "number"), ("bool", "boolean")):
        if word in text:
            return kind
    return ""


def _example(param: Any, kind: str) -> str:
    """A value to show in the fix: the parameter's default when it has one of the right kind, else a plain one."""
    default = getattr(param, "default", None)
    if kind == "integer":
        ok = isinstance(default, int) and not isinstance(default, bool) and default > 0
        return str(default) if ok else "8"
    if kind == "number":
        ok = isinstance(default, int | float) and not isinstance(default, bool) and default > 0
        return f"{default:g}" if ok else "0.5"
    return ""


def _given(err: BaseException, param: Any, args: Sequence[str], kind: str, choices: list[str]) -> str | None:
    """The value the user gave for ``param``: from the conversion error itself (typer >= 0.29 keeps pydantic's
    input), else from the command line (the first value of that option that is not of the expected kind)."""
    cause = err.__cause__
    if cause is not None and hasattr(cause, "errors"):
        try:
            value = cause.errors()[0].get("input")
        except (AttributeError, IndexError, TypeError):
            value = None
        if isinstance(value, str):
            return value
    opts = [*(getattr(param, "opts", None) or ()), *(getattr(param, "secondary_opts", None) or ())]
    found: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            break
        for opt in opts:
            if arg == opt and i + 1 < len(args):
                found.append(args[i + 1])
            elif opt.startswith("--") and arg.startswith(opt + "="):
                found.append(arg[len(opt) + 1 :])
            elif len(opt) == 2 and not arg.startswith("--") and arg.startswith(opt) and len(arg) > 2:
                found.append(arg[2:])
    for value in found:
        if not _fits(value, kind, choices):
            return value
    return found[-1] if found else None


def _fits(value: str, kind: str, choices: list[str]) -> bool:
    if choices:
        return value in choices
    try:
        if kind == "integer":
            int(value)
        elif kind == "number":
            float(value)
    except ValueError:
        return False
    return True


def _bad_value(err: Any, path: str, args: Sequence[str]) -> str:
    param = getattr(err, "param", None)
    opt = _option(param)
    message = str(getattr(err, "message", "") or err)
    choices = _choices(param)
    kind = "" if choices else _kind(message)
    value = _given(err, param, args, kind, choices)
    said = f"'{shown(value)}' is not" if value is not None else "not"
    if choices:
        return f"{path}: {opt}: {said} a valid choice: choose one of {', '.join(choices)}"
    if kind == "integer":
        return f"{path}: {opt}: {said} a valid integer: give a whole number, e.g. {opt} {_example(param, kind)}"
    if kind == "number":
        return f"{path}: {opt}: {said} a valid number: give a number, e.g. {opt} {_example(param, kind)}"
    if kind == "boolean":
        return f"{path}: {opt}: {said} true or false: give true or false"
    given = f"'{shown(value)}': " if value is not None else ""
    return f"{path}: {opt}: {given}{shown(message.rstrip('.'), 120)}: see '{path} --help'"


def _where(err: BaseException, args: Sequence[str], root: Any, prog: str) -> tuple[str, Any]:
    """The command path (``plansim simulate``) and the command that ``err`` is about. Click leaves the context out
    of some errors (an option missing its value): then the command is the first argument naming one of ``root``'s."""
    ctx = getattr(err, "ctx", None)
    if ctx is not None:
        return ctx.command_path, ctx.command
    commands = getattr(root, "commands", None) or {}
    name = next((a for a in args if a in commands), None)
    return (f"{prog} {name}", commands[name]) if name is not None else (prog, root)


def usage_line(err: BaseException, args: Sequence[str], root: Any = None, prog: str = "plansim") -> str:
    """One line for click's usage error ``err`` raised for the command line ``args`` (of the group ``root``, called
    ``prog``): the command, the option and the fix."""
    ctx = getattr(err, "ctx", None)
    path, command = _where(err, args, root, prog)
    see = f"see '{path} --help'"
    if _is(err, "MissingParameter"):
        param = getattr(err, "param", None)
        choices = _choices(param)
        help_text = " ".join(str(getattr(param, "help", None) or "").split())
        opt = _option(param)
        what = f" ({shown(help_text, 100)})" if help_text else ""
        fix = f"choose one of {', '.join(choices)}" if choices else f"add {opt} ..." if opt.startswith("-") else see
        return f"{path}: {opt} is required{what}: {fix}"
    if _is(err, "BadParameter"):
        return _bad_value(err, path, args)
    if _is(err, "NoSuchOption"):
        name = shown(str(getattr(err, "option_name", "") or ""))
        possible = sorted(getattr(err, "possibilities", None) or ())
        return f"{path}: no such option {name}: " + (f"did you mean {' or '.join(possible)}?" if possible else see)
    if _is(err, "BadOptionUsage") and "requires" in str(getattr(err, "message", "")):
        name = str(getattr(err, "option_name", "") or "")
        params = getattr(command, "params", None) or ()
        param = next((p for p in params if name in (getattr(p, "opts", None) or ())), None)
        kind = _kind(getattr(getattr(param, "type", None), "name", "") or "") or _annotation_kind(param)
        example = _example(param, kind)
        opt = _option(param) if param is not None else shown(name)
        return f"{path}: {opt} needs a value" + (f", e.g. {opt} {example}" if example else f": {see}")
    message = shown(str(getattr(err, "message", "") or err).rstrip("."), 120)
    message = (message[:1].lower() + message[1:]).replace(". Did you mean", ": did you mean")
    if "did you mean" in message:
        return f"{path}: {message}"
    commands = getattr(getattr(ctx, "command", None), "list_commands", None)
    if message.startswith("no such command") and commands is not None and ctx is not None:
        return f"{path}: {message}: choose one of {', '.join(commands(ctx))}"
    return f"{path}: {message}: {see}"


def _annotation_kind(param: Any) -> str:
    """ "integer" or "number" from a typer >= 0.29 parameter's annotation (``int | None`` included)."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    names = {getattr(a, "__name__", "") for a in (annotation, *getattr(annotation, "__args__", ()))}
    if "int" in names:
        return "integer"
    if "float" in names:
        return "number"
    return ""


class OneLineGroup(TyperGroup):
    """The app's group: click's usage errors as one line on stderr (``usage_line``), exit 2; the rest as typer
    does it (``--help``, the commands' exit codes, Ctrl-C as 130)."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        argv = list(sys.argv[1:] if args is None else args)
        try:
            code = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except _CLICK_EXCEPTION as err:
            _exit_with(err, argv, self, prog_name or "plansim")
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else 0)


def _exit_with(err: Exception, argv: Sequence[str], root: Any, prog: str) -> NoReturn:
    code = int(getattr(err, "exit_code", 1))
    if _is(err, "NoArgsIsHelpError"):  # no arguments: the help, already printed by typer's rich help or held here
        text = str(getattr(err, "message", "") or "")
        if text.strip():
            typer.echo(text, err=True)
        sys.exit(code)
    if _is(err, "UsageError"):
        typer.echo(usage_line(err, argv, root, prog), err=True)
    else:  # another click error (a file option that cannot be opened): its own message, on one line
        path = _where(err, argv, root, prog)[0]
        formatted = getattr(err, "format_message", None)
        typer.echo(f"{path}: {shown(formatted() if formatted else str(err), 160)}", err=True)
    sys.exit(code)
