"""The ``plansim`` command line. It prints what the public API returns and holds no logic of its own.

Bad input ends with one line on stderr (``error: ...``) and exit code 2, never a traceback.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Callable
from enum import StrEnum
from functools import wraps
from typing import Annotated, Any, TypeVar

import typer

app = typer.Typer(
    name="plansim",
    help="Predict a distributed training step: latency, communication and memory per GPU.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

F = TypeVar("F", bound=Callable[..., Any])


class OutputFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def _clear_errors(func: F) -> F:
    """Turn a PlansimError into one line on stderr and exit code 2."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from plansim.errors import PlansimError

        try:
            return func(*args, **kwargs)
        except PlansimError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(code=2) from None

    return wrapper  # type: ignore[return-value]


def _print_rows(rows: list[dict[str, Any]], fmt: OutputFormat, title: str) -> None:
    if fmt is OutputFormat.json:
        typer.echo(json.dumps(rows, indent=2))
    elif fmt is OutputFormat.csv:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        typer.echo(buf.getvalue(), nl=False)
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for key in rows[0]:
            table.add_column(key)
        for row in rows:
            table.add_row(*(str(v) for v in row.values()))
        Console(width=200).print(table)


@app.command()
@_clear_errors
def models(fmt: Annotated[OutputFormat, typer.Option("--format", help="output format")] = OutputFormat.table) -> None:
    """List the built-in model presets."""
    from plansim.workload import list_models

    _print_rows(list_models(), fmt, "model presets")


@app.command()
@_clear_errors
def hardware(fmt: Annotated[OutputFormat, typer.Option("--format", help="output format")] = OutputFormat.table) -> None:
    """List the built-in hardware profiles (node types)."""
    from plansim.hardware import list_hardware

    _print_rows(list_hardware(), fmt, "hardware profiles")


@app.command()
@_clear_errors
def simulate(
    model: Annotated[str, typer.Option("--model", "-m", help="preset name (plansim models) or model YAML path")],
    hardware: Annotated[str, typer.Option("--hardware", "-H", help="node type (plansim hardware) or YAML path")],
    strategy: Annotated[
        str, typer.Option("--strategy", "-s", help="'dp=8,tp=2,pp=1,...', a strategy YAML path or a shipped name")
    ],
    gpus: Annotated[int | None, typer.Option("--gpus", "-g", help="GPUs in the cluster (default dp*tp*pp)")] = None,
    engine: Annotated[str, typer.Option("--engine", "-e", help="analytic")] = "analytic",
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f", help="output format")] = OutputFormat.table,
) -> None:
    """Predict one training step of MODEL on HARDWARE under STRATEGY."""
    from plansim.api import simulate as run

    result = run(model, hardware, strategy, gpus=gpus, engine=engine)
    if fmt is OutputFormat.json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    elif fmt is OutputFormat.csv:
        _print_rows([result.to_row()], fmt, "")
    else:
        from plansim.report.text import print_result

        print_result(result)


def main() -> None:
    """Entry point of the ``plansim`` script."""
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover - `python -m plansim.cli`
    main()
