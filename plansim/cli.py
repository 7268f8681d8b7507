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
    engine: Annotated[
        str, typer.Option("--engine", "-e", help="analytic (closed form) or des (discrete-event simulation)")
    ] = "analytic",
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f", help="output format")] = OutputFormat.table,
    trace: Annotated[
        str | None, typer.Option("--trace", help="des: write the timeline as Chrome trace JSON (open in Perfetto)")
    ] = None,
    mode: Annotated[
        str | None, typer.Option("--mode", help="des: symmetric (one rank per stage, default) or full (every rank)")
    ] = None,
    straggler: Annotated[
        list[str] | None, typer.Option("--straggler", help="des: RANK=FACTOR, that GPU's kernels FACTOR x slower")
    ] = None,
    degrade_link: Annotated[
        list[str] | None,
        typer.Option("--degrade-link", help="des: LINK=FACTOR bandwidth factor (LINK: node0/nic0, leaf0, u--v)"),
    ] = None,
    fail_link: Annotated[
        list[str] | None, typer.Option("--fail-link", help="des: LINK removed; traffic is rerouted around it")
    ] = None,
    jitter: Annotated[
        float | None, typer.Option("--jitter", help="des: log-normal noise on kernel times (sigma, e.g. 0.05)")
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="des: random seed of --jitter")] = None,
) -> None:
    """Predict one training step of MODEL on HARDWARE under STRATEGY."""
    from plansim.api import simulate as run
    from plansim.errors import PlansimError

    if trace and engine != "des":
        raise PlansimError("--trace needs the discrete-event engine: add --engine des")
    result = run(
        model,
        hardware,
        strategy,
        gpus=gpus,
        engine=engine,
        mode=mode,
        stragglers={int(k): v for k, v in _pairs(straggler, "--straggler", "RANK=FACTOR", "3=1.5").items()} or None,
        link_factors=_pairs(degrade_link, "--degrade-link", "LINK=FACTOR", "node0/nic0=0.5") or None,
        failed_links=tuple(fail_link or ()),
        jitter=jitter,
        seed=seed,
    )
    if trace:
        try:
            path = result.timeline.write_trace(trace)
        except OSError as err:
            raise PlansimError(
                f"--trace {trace}: cannot write it ({err.strerror}): choose a writable file path"
            ) from None
        typer.echo(f"trace written to {path}", err=True)
    if fmt is OutputFormat.json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    elif fmt is OutputFormat.csv:
        _print_rows([result.to_row()], fmt, "")
    else:
        from plansim.report.text import print_result

        print_result(result)


def _pairs(values: list[str] | None, option: str, form: str, example: str) -> dict[str, float]:
    """Parse repeated ``KEY=NUMBER`` options; a malformed one is a clear error naming the option."""
    from plansim.errors import PlansimError

    out: dict[str, float] = {}
    for value in values or ():
        key, sep, number = value.rpartition("=")
        try:
            if not sep or not key:
                raise ValueError
            out[key] = float(number)
            if option == "--straggler":
                int(key)
        except ValueError:
            raise PlansimError(f"{option} {value!r}: expected {form}, e.g. {option} {example}") from None
    return out


def main() -> None:
    """Entry point of the ``plansim`` script."""
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover - `python -m plansim.cli`
    main()
