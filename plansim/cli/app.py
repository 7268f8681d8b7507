"""The ``plansim`` command line (typer): ``simulate``, ``plan``, ``compare``, ``remat``, ``profile``, ``validate``,
``import``, ``sweep``, ``models``, ``hardware``. It prints what the public API returns and holds no logic of its own.
A long command shows its progress on stderr (``_progress``, ``_timed``, ``_with_steps``: ``plansim.report.progress``).

Bad input ends with one line on stderr (``error: ...``; a usage error: ``plansim COMMAND: --option: ...``, see
``plansim.cli.usage``) and exit code 2, never a traceback.
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

from plansim.cli.usage import OneLineGroup

app = typer.Typer(
    name="plansim",
    help="Predict a distributed training step: latency, communication and memory per GPU.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=OneLineGroup,  # usage errors (a wrong option type, an unknown option) as one line, exit 2
)

F = TypeVar("F", bound=Callable[..., Any])

#: ``--seq-len`` on simulate, plan, compare and sweep: one text for the four (sweep takes a list of lengths).
SEQ_LEN_HELP = (
    "tokens per sequence the run trains at, overriding the model's (a preset's, a model file's, a config.json's "
    "context length); a strategy or grid file may give seq_len instead, and the two must then agree"
)


#: ``--moe-imbalance`` on simulate, plan and compare.
MOE_IMBALANCE_HELP = (
    "mixture of experts: routed tokens the busiest expert-parallel rank receives over the mean (1.0: balanced, the "
    "default; the step runs at that rank's pace)"
)


def _version(value: bool) -> None:
    """``plansim --version``: the installed package's version (its metadata), then exit."""
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"plansim {version('plansim')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("plansim (not installed: no package metadata)")
        raise typer.Exit()


@app.callback()
def _main(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="print plansim's version and exit"),
    ] = False,
) -> None:
    """Predict a distributed training step: latency, communication and memory per GPU."""


class OutputFormat(StrEnum):
    table = "table"
    json = "json"
    csv = "csv"


def _clear_errors(func: F) -> F:
    """Run a command with its input files recorded (``yamlfile.recording_inputs``: no output replaces one); turn a
    PlansimError into one line on stderr and exit code 2, and a MemoryError (the last resort: the memory bounds
    refuse such runs before they allocate) into one line and exit code 1."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from plansim.errors import PlansimError
        from plansim.files.yamlfile import recording_inputs

        try:
            with recording_inputs():
                return func(*args, **kwargs)
        except PlansimError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(code=2) from None
        except MemoryError:
            typer.echo(
                "error: out of memory: this run needs more memory than the system gives it: ask for less (fewer "
                "GPUs, a narrower search) or run it where more memory is free",
                err=True,
            )
            raise typer.Exit(code=1) from None

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
        from rich.table import Table

        from plansim.report.fit import print_fitted, terminal_console

        table = Table(title=title)
        for key in rows[0]:
            table.add_column(key)
        for row in rows:
            table.add_row(*(str(v) for v in row.values()))
        keys = list(rows[0])  # a narrow terminal leaves out the last columns first, never the first two
        print_fitted(terminal_console(), table, elastic=keys[0], optional=keys[:1:-1], more="--format json or csv")


@app.command()
@_clear_errors
def models(fmt: Annotated[OutputFormat, typer.Option("--format", help="output format")] = OutputFormat.table) -> None:
    """List the built-in model presets (the table rounds the parameter counts; json and csv give them whole)."""
    from plansim.workload import list_models

    rows = list_models()
    if fmt is OutputFormat.table:
        rows = [
            {
                **row,
                "parameters": _human_count(row["parameters"]),
                "active_parameters": _human_count(row["active_parameters"]),
            }
            for row in rows
        ]
    _print_rows(rows, fmt, "model presets")


def _human_count(n: int) -> str:
    """A count as people write parameter counts: ``125.2M``, ``1.3B``, ``1.0T``.

    >>> _human_count(125_226_240), _human_count(1_315_723_264), _human_count(999)
    ('125.2M', '1.3B', '999')
    """
    for size, unit in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "k")):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


@app.command()
@_clear_errors
def hardware(
    fmt: Annotated[OutputFormat, typer.Option("--format", help="output format")] = OutputFormat.table,
    links: Annotated[
        bool, typer.Option("--links", help="list the link names of -H on -g GPUs (for --degrade-link, --fail-link)")
    ] = False,
    node: Annotated[str, typer.Option("--hardware", "-H", help="with --links: node type or YAML path")] = "dgx-a100",
    gpus: Annotated[int | None, typer.Option("--gpus", "-g", help="with --links: GPUs (default one node)")] = None,
) -> None:
    """List the built-in hardware profiles (node types), or with --links the link names of a cluster."""
    from plansim.hardware import list_hardware, load_hardware

    if links:
        from plansim.des.routing import Fabric

        cluster = load_hardware(node, gpus=gpus)
        typer.echo(f"{cluster.name}, {cluster.num_gpus:,} GPUs\n{Fabric(cluster).describe_links()}")
        return
    _print_rows(list_hardware(), fmt, "hardware profiles")


@app.command()
@_clear_errors
def simulate(
    model: Annotated[str, typer.Option("--model", "-m", help="preset name (plansim models) or model YAML path")],
    strategy: Annotated[
        str, typer.Option("--strategy", "-s", help="'dp=8,tp=2,pp=1,...', a strategy YAML path or a shipped name")
    ],
    hardware: Annotated[str, typer.Option("--hardware", "-H", help="node type (plansim hardware) or YAML path")] = (
        "dgx-a100"
    ),
    gpus: Annotated[int | None, typer.Option("--gpus", "-g", help="GPUs in the cluster (default dp*tp*cp*pp)")] = None,
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
        typer.Option(
            "--degrade-link",
            help="des: LINK=FACTOR bandwidth factor; LINK a vertex (node0/nic0, leaf0/rail0, spine0) or an edge "
            "u--v (plansim hardware --links -H NODE -g N lists them)",
        ),
    ] = None,
    fail_link: Annotated[
        list[str] | None,
        typer.Option(
            "--fail-link", help="des: LINK removed, traffic rerouted around it (plansim hardware --links lists them)"
        ),
    ] = None,
    jitter: Annotated[
        float | None, typer.Option("--jitter", help="des: log-normal noise on kernel times (sigma, e.g. 0.05)")
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="des: random seed of --jitter")] = None,
    framework: Annotated[
        str | None,
        typer.Option("--framework", help="run the strategy as this framework does (megatron, deepspeed, fsdp)"),
    ] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help=SEQ_LEN_HELP)] = None,
    moe_imbalance: Annotated[float | None, typer.Option("--moe-imbalance", help=MOE_IMBALANCE_HELP)] = None,
    moe_imbalance_spread: Annotated[
        float | None,
        typer.Option(
            "--moe-imbalance-spread",
            help="des: sample the imbalance per micro-batch (seeded by --seed), its excess over 1 log-normal with "
            "this sigma and mean --moe-imbalance minus 1",
        ),
    ] = None,
) -> None:
    """Predict one training step of MODEL on HARDWARE under STRATEGY."""
    from plansim.api import simulate as run
    from plansim.errors import PlansimError, shown_path
    from plansim.files.outputs import check_output_file

    if trace is not None and engine != "des":
        raise PlansimError("--trace needs the discrete-event engine: add --engine des")
    if trace is not None:
        check_output_file(trace, "--trace", inputs=(model, hardware, strategy))  # before the run, not after it
    result = _timed(f"simulate: {engine} engine", run)(
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
        seq_len=seq_len,
        framework=framework,
        moe_imbalance=moe_imbalance,
        moe_imbalance_spread=moe_imbalance_spread,
    )
    if trace is not None:
        try:
            path = result.timeline.write_trace(trace)
        except OSError as err:
            raise PlansimError(
                f"--trace {shown_path(trace)}: cannot write it ({err.strerror}): choose a writable file path"
            ) from None
        typer.echo(f"trace written to {path}", err=True)
    if fmt is OutputFormat.json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    elif fmt is OutputFormat.csv:
        _print_rows([result.to_row()], fmt, "")
    else:
        from plansim.report.text import print_result

        print_result(result)


class PlanFormat(StrEnum):
    text = "text"
    json = "json"


@app.command()
@_clear_errors
def plan(
    model: Annotated[str, typer.Option("--model", "-m", help="preset name (plansim models) or model YAML path")],
    global_batch: Annotated[int, typer.Option("--global-batch", "-B", help="sequences per training step")],
    hardware: Annotated[str, typer.Option("--hardware", "-H", help="node type (plansim hardware) or YAML path")] = (
        "dgx-a100"
    ),
    gpus: Annotated[int | None, typer.Option("--gpus", "-g", help="GPUs in the cluster (default one node)")] = None,
    tp: Annotated[int | None, typer.Option("--tp", help="fix the tensor-parallel degree")] = None,
    pp: Annotated[int | None, typer.Option("--pp", help="fix the pipeline-parallel degree")] = None,
    cp: Annotated[
        int | None,
        typer.Option(
            "--cp", help="fix the context-parallel degree (default: searched for sequences of 16K and longer)"
        ),
    ] = None,
    cp_algorithm: Annotated[
        str | None, typer.Option("--cp-algorithm", help="context parallelism's form: ring or all_to_all")
    ] = None,
    ep: Annotated[
        int | None,
        typer.Option("--ep", help="fix expert parallelism's degree (default: searched for mixture-of-experts models)"),
    ] = None,
    etp: Annotated[
        int | None, typer.Option("--etp", help="fix tensor parallelism inside the experts (default: searched)")
    ] = None,
    max_pp: Annotated[int | None, typer.Option("--max-pp", help="at most this many pipeline stages")] = None,
    zero: Annotated[int | None, typer.Option("--zero", help="fix the ZeRO stage (0-3)")] = None,
    micro_batch: Annotated[int | None, typer.Option("--micro-batch", help="fix the micro-batch size")] = None,
    schedule: Annotated[str | None, typer.Option("--schedule", help="fix the pipeline schedule")] = None,
    remat: Annotated[
        str | None,
        typer.Option(
            "--remat",
            help="remat policies to search, comma-separated (default: those the framework runs; milp: finalists only)",
        ),
    ] = None,
    allow_cross_node_tp: Annotated[
        bool, typer.Option("--allow-cross-node-tp", help="let tensor parallelism span nodes")
    ] = False,
    objective: Annotated[
        str, typer.Option("--objective", help="step_time, tokens_per_s or cost (with --price-per-gpu-hour)")
    ] = "step_time",
    top: Annotated[int, typer.Option("--top", help="finalists re-simulated with the discrete-event engine")] = 10,
    no_des: Annotated[bool, typer.Option("--no-des", help="rank by the analytic engine only")] = False,
    jobs: Annotated[
        int | None,
        typer.Option("--jobs", "-j", help="processes pricing and re-simulating (default: the cores)"),
    ] = None,
    tokens: Annotated[float | None, typer.Option("--tokens", help="tokens to train on: time and GPU-hours")] = None,
    price: Annotated[
        float | None, typer.Option("--price-per-gpu-hour", help="with --tokens: the cost of the training run")
    ] = None,
    out: Annotated[
        str | None, typer.Option("--out", "-o", help="write results.csv/.json, winner.yaml and charts here")
    ] = None,
    fmt: Annotated[PlanFormat, typer.Option("--format", "-f", help="output format")] = PlanFormat.text,
    framework: Annotated[
        str,
        typer.Option("--framework", help="the framework the candidates run under (megatron, deepspeed, fsdp, or all)"),
    ] = "megatron",
    robust: Annotated[
        bool,
        typer.Option(
            "--robust", help="rank by the worst case over the hardware profiles' uncertainty ranges; say how robust"
        ),
    ] = False,
    tp_comm_overlap: Annotated[
        bool | None,
        typer.Option(
            "--tp-comm-overlap/--no-tp-comm-overlap",
            help="Megatron-LM's --tp-comm-overlap: search only it, or never (default: tried on the finalists)",
        ),
    ] = None,
    headroom: Annotated[
        str | None,
        typer.Option(
            "--headroom",
            help="GPU memory a plan must leave free at its peak: a fraction, a percentage or a size (0.05, 5%, 4GB; "
            "default 5%, where plansim warns of a thin margin; 0 lets a plan fill the GPU)",
        ),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype",
            help="training dtypes to search, comma-separated (bf16,fp8: FP8 GEMMs where the GPU and framework run "
            "them; default: bf16, or fp16 on a GPU without it)",
        ),
    ] = None,
    offload: Annotated[
        str | None,
        typer.Option(
            "--offload",
            help="also search offloading to host memory: optimizer, params, activations (comma-separated) or all, in "
            "the combinations the framework runs (default: none)",
        ),
    ] = None,
    dp_algorithms: Annotated[
        str | None,
        typer.Option(
            "--dp-algorithms",
            help="all-reduce algorithms to search, comma-separated, among those the framework's library runs "
            "(default: nccl, NCCL's own pick; ring forces NCCL's ring)",
        ),
    ] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help=SEQ_LEN_HELP)] = None,
    moe_imbalance: Annotated[float | None, typer.Option("--moe-imbalance", help=MOE_IMBALANCE_HELP)] = None,
) -> None:
    """Search every parallel strategy for --model on --gpus GPUs at --global-batch: rank, explain, write."""
    from plansim.costs.remat_policies import REMAT_POLICIES
    from plansim.errors import PlansimError, shown
    from plansim.files.outputs import check_output_folder
    from plansim.planner import Constraints
    from plansim.planner import plan as run_plan
    from plansim.planner.output import plan_summary, write_plan
    from plansim.planner.space import headroom_of
    from plansim.step.result import THIN_MARGIN

    check_output_folder(out)  # before the search, not after it
    policies = None if remat is None else tuple(p.strip() for p in remat.split(",") if p.strip())
    if policies is not None and ([p for p in policies if p not in REMAT_POLICIES] or not policies):
        raise PlansimError(f"--remat {shown(remat)}: choose among {', '.join(REMAT_POLICIES)}, comma-separated")
    searched = None if policies is None else tuple(p for p in policies if not REMAT_POLICIES[p].scheduled) or ("full",)
    algorithms = None if dp_algorithms is None else tuple(a.strip() for a in dp_algorithms.split(",") if a.strip())
    room, room_bytes = (THIN_MARGIN, None) if headroom is None else headroom_of(headroom)
    constraints = Constraints(
        tp=tp, pp=pp, cp=cp, cp_algorithm=cp_algorithm, ep=ep, etp=etp, max_pp=max_pp, zero=zero,
        micro_batch=micro_batch,
        schedule=schedule, remat=searched,
        allow_cross_node_tp=allow_cross_node_tp, framework=framework, tp_comm_overlap=tp_comm_overlap,
        dp_algorithms=algorithms, dtype=dtype, offload=offload, headroom=room, headroom_bytes=room_bytes,
    )  # fmt: skip
    with _progress("plan") as bar:
        bar.update(label="pricing candidates")
        result = run_plan(
            model, hardware, gpus=gpus, global_batch=global_batch, constraints=constraints, objective=objective,
            top_k=top, des=not no_des, milp=policies is None or "milp" in policies,
            jobs=jobs, tokens=tokens, price_per_gpu_hour=price, progress=bar.counter(), phase=bar.phase,
            robust=robust, seq_len=seq_len, moe_imbalance=moe_imbalance,
        )  # fmt: skip
    if result.winner is None:
        raise PlansimError(result.explanation)
    from plansim.planner.text import print_plan

    _report(result, out, fmt, write_plan, plan_summary, print_plan)


def _timed(what: str, func: F) -> F:
    """``func`` run under progress that shows ``what`` and the time going by (for one long call)."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _progress(what):
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _progress(what: str, total: int | None = None, live: bool | None = None) -> Any:
    """Progress on stderr (``report.progress.Progress``): a bar on a terminal, plain lines after a few seconds
    elsewhere; never on stdout."""
    from plansim.report.progress import Progress

    return Progress(what, total, live=live)


def _report(
    result: Any,
    out: str | None,
    fmt: PlanFormat,
    write: Callable[[Any, str], list[Any]],
    summarize: Callable[[Any], dict[str, Any]],
    show: Callable[[Any, list[Any]], None],
) -> None:
    """Write ``result``'s files into ``out`` (if given), then print it as JSON (with the files) or for a terminal."""
    files = write(result, out) if out is not None else []
    if fmt is PlanFormat.json:
        summary = summarize(result)
        summary["files"] = [str(f) for f in files]
        typer.echo(json.dumps(summary, indent=2))
    else:
        show(result, files)


@app.command()
@_clear_errors
def compare(
    model: Annotated[str, typer.Option("--model", "-m", help="preset name (plansim models) or model YAML path")],
    strategy: Annotated[
        list[str],
        typer.Option("--strategy", "-s", help="a strategy to compare (repeat): inline 'dp=8,tp=2,...', YAML or name"),
    ],
    hardware: Annotated[
        list[str] | None, typer.Option("--hardware", "-H", help="node type or YAML path (repeat to compare)")
    ] = None,
    gpus: Annotated[
        int | None, typer.Option("--gpus", "-g", help="GPUs of every cluster (default: each strategy's dp*tp*cp*pp)")
    ] = None,
    engine: Annotated[str, typer.Option("--engine", "-e", help="des (default: gives the timeline) or analytic")] = (
        "des"
    ),
    scaling: Annotated[
        str | None, typer.Option("--scaling", help="GPU counts for throughput curves, comma-separated: 256,512,1024")
    ] = None,
    scaling_engine: Annotated[
        str, typer.Option("--scaling-engine", help="engine of the scaling curves: analytic (default) or des")
    ] = "analytic",
    scaling_batch: Annotated[
        str,
        typer.Option("--scaling-batch", help="fixed (keep the global batch, default) or per-replica (grow it with dp)"),
    ] = "fixed",
    objective: Annotated[
        str,
        typer.Option("--objective", help="rank by tokens_per_s (default), step_time or cost (GPU-hours per token)"),
    ] = "tokens_per_s",
    out: Annotated[
        str | None, typer.Option("--out", "-o", help="write results.csv/.json, scaling.csv and the charts here")
    ] = None,
    fmt: Annotated[PlanFormat, typer.Option("--format", "-f", help="output format")] = PlanFormat.text,
    framework: Annotated[
        list[str] | None,
        typer.Option("--framework", help="run each strategy under this framework (repeat to set them side by side)"),
    ] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", help=SEQ_LEN_HELP)] = None,
    moe_imbalance: Annotated[float | None, typer.Option("--moe-imbalance", help=MOE_IMBALANCE_HELP)] = None,
) -> None:
    """Simulate several strategies and/or hardware profiles for one model; table, charts and scaling curves."""
    from plansim.comparison.compare import compare as run_compare
    from plansim.comparison.output import comparison_summary, print_comparison, write_comparison
    from plansim.errors import PlansimError, shown
    from plansim.files.outputs import check_output_folder

    check_output_folder(out)  # before the runs, not after them
    counts: list[int] = []
    for item in (scaling or "").split(","):
        if item.strip():
            try:
                counts.append(int(item))
            except ValueError:
                raise PlansimError(f"--scaling {shown(scaling)}: expected GPU counts such as 256,512,1024") from None
    total = len(strategy) * len(hardware or ["dgx-a100"]) * (1 + len(counts)) * max(1, len(set(framework or ())))
    result = _with_steps(
        "compare",
        total,
        lambda step: run_compare(
            model, strategy, hardware or ["dgx-a100"], gpus=gpus, engine=engine, scaling_gpus=counts,
            scaling_engine=scaling_engine, scaling_batch=scaling_batch, objective=objective, progress=step,
            frameworks=framework or (), seq_len=seq_len, moe_imbalance=moe_imbalance,
        ),
    )  # fmt: skip
    _report(result, out, fmt, write_comparison, comparison_summary, print_comparison)


@app.command()
@_clear_errors
def sweep(
    out: Annotated[str, typer.Option("--out", "-o", help="write sweep.csv (+ sweep.parquet) and the charts here")],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="models, comma-separated: presets or YAML paths")
    ] = None,
    gpus: Annotated[str | None, typer.Option("--gpus", "-g", help="GPU counts, comma-separated: 8,16,32")] = None,
    hardware: Annotated[
        str | None, typer.Option("--hardware", "-H", help="node types, comma-separated (default dgx-a100)")
    ] = None,
    global_batch: Annotated[
        str | None, typer.Option("--global-batch", "-B", help="sequences per step, comma-separated: 64,128")
    ] = None,
    grid: Annotated[
        str | None,
        typer.Option("--grid", help="a YAML grid (keys model, hardware, gpus, global_batch, seq_len) instead"),
    ] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", help="plan N points at a time in local processes")] = 1,
    scheduler: Annotated[
        str | None, typer.Option("--scheduler", help="run on the Dask cluster at ADDRESS (needs the dask extra)")
    ] = None,
    des: Annotated[
        bool, typer.Option("--des", help="rank each point's finalists by the discrete-event engine (slower)")
    ] = False,
    milp: Annotated[bool, typer.Option("--milp", help="try remat=milp for the finalists (time-limited)")] = False,
    top: Annotated[int, typer.Option("--top", help="finalists per point (re-simulated with --des)")] = 10,
    objective: Annotated[str, typer.Option("--objective", help="step_time, tokens_per_s or cost")] = "step_time",
    fmt: Annotated[PlanFormat, typer.Option("--format", "-f", help="output format")] = PlanFormat.text,
    headroom: Annotated[
        str | None,
        typer.Option(
            "--headroom", help="GPU memory each point's plan must leave free: a fraction or a percentage (0.05, 5%)"
        ),
    ] = None,
    seq_len: Annotated[
        str | None, typer.Option("--seq-len", help=SEQ_LEN_HELP + "; comma-separated to sweep several: 2048,4096")
    ] = None,
) -> None:
    """Plan every point of a grid (models x hardware x GPU counts x global batches): one table, CSV, charts."""
    from plansim.errors import PlansimError
    from plansim.files.outputs import check_output_folder
    from plansim.planner.space import headroom_of
    from plansim.step.result import THIN_MARGIN
    from plansim.sweep import SweepSettings, grid_from_options
    from plansim.sweep import sweep as run_sweep
    from plansim.sweep.output import print_sweep, sweep_summary, write_sweep

    check_output_folder(out)  # before the points run, not after them
    the_grid = grid_from_options(model, gpus, global_batch, hardware, grid, seq_len)
    room, size = (THIN_MARGIN, None) if headroom is None else headroom_of(headroom)
    if size is not None:  # the points may run on different GPUs: a fraction means the same on each
        raise PlansimError(f"--headroom {headroom}: a sweep takes a fraction or a percentage (0.05, 5%), not a size")
    settings = SweepSettings(des=des, milp=milp, top_k=top, objective=objective, headroom=room)
    # Dask's own log lines would tear a live bar: plain lines with a scheduler
    with _progress("sweep: points planned", len(the_grid), live=False if scheduler is not None else None) as bar:
        result = run_sweep(the_grid, settings, jobs=jobs, scheduler=scheduler, progress=bar.counter())
    _report(result, out, fmt, write_sweep, sweep_summary, print_sweep)


@app.command()
@_clear_errors
def validate(
    out: Annotated[
        str | None,
        typer.Option("--out", "-o", help="output folder (default validation/<gpu>/; with --from, that folder)"),
    ] = None,
    device: Annotated[str | None, typer.Option("--device", help="cuda or cpu (default: cuda where torch sees one)")] = (
        None
    ),
    hardware: Annotated[
        str | None,
        typer.Option("--hardware", "-H", help="node type to predict for (default: the device's GPU; a CPU: dgx-a100)"),
    ] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32")] = "bf16",
    quick: Annotated[bool, typer.Option("--quick", help="4 configurations on a GPU, 3 on a CPU")] = False,
    warmup: Annotated[int, typer.Option("--warmup", help="untimed steps before timing")] = 3,
    repeats: Annotated[int, typer.Option("--repeats", help="timed steps; the median is kept")] = 10,
    engine: Annotated[str, typer.Option("--engine", help="analytic or des")] = "analytic",
    from_dir: Annotated[
        str | None, typer.Option("--from", help="compare the measured.csv in this folder again (no torch needed)")
    ] = None,
) -> None:
    """Run real training steps of GPT/Llama models and compare them with plansim's predictions (needs torch)."""
    from plansim.validation.run import compare_saved
    from plansim.validation.run import validate as run_validation

    if from_dir:
        *_, written = compare_saved(from_dir, out=out, hardware=hardware, engine=engine)
    else:
        _require_torch("plansim validate", "pip install 'plansim[torch]' (or compare saved runs: --from DIR)")
        from plansim.profiling.profiler import check_timing, pick_device
        from plansim.validation.points import default_points
        from plansim.validation.run import default_folder, resolve_hardware

        check_timing(warmup, repeats)
        device = pick_device(device)
        hardware = resolve_hardware(device, hardware)
        points = default_points(device, quick=quick)
        command = "plansim validate " + " ".join(sys.argv[2:]) if len(sys.argv) > 1 else "plansim validate"
        *_, written = _with_steps(
            "validate: points",
            len(points),
            lambda step: run_validation(
                points, out or default_folder(device), device=device, hardware=hardware, dtype=dtype,
                warmup=warmup, repeats=repeats, engine=engine, command=command, progress=step,
            ),
        )  # fmt: skip
    typer.echo(next(p for p in written if p.name == "summary.md").read_text(), nl=False)
    typer.echo("wrote " + ", ".join(str(p) for p in written))


def _require_torch(command: str, fix: str) -> None:
    """One line, exit 2, where torch is not installed."""
    from plansim.errors import PlansimError

    try:
        import torch  # noqa: F401
    except ImportError:
        raise PlansimError(f"{command} needs torch: {fix}") from None


def _with_steps(what: str, total: int, run: Callable[[Callable[[str], None]], Any]) -> Any:
    """Run ``run(step)`` under progress that advances at each ``step(label)`` after the first."""
    with _progress(what, total) as bar:
        started = [False]

        def step(label: str) -> None:
            bar.advance(label, by=1 if started[0] else 0)
            started[0] = True

        return run(step)


@app.command()
@_clear_errors
def profile(
    out: Annotated[
        str | None,
        typer.Option("--out", "-o", help="profile YAML (default hardware_profiles/measured/<device>.yaml)"),
    ] = None,
    device: Annotated[str | None, typer.Option("--device", help="cuda or cpu (default: cuda where torch sees one)")] = (
        None
    ),
    dtype: Annotated[str, typer.Option("--dtype", help="bf16, fp16 or fp32")] = "bf16",
    model: Annotated[str, typer.Option("--model", "-m", help="the widths to sweep: a preset or model YAML")] = (
        "gpt3-1.3b"
    ),
    quick: Annotated[bool, typer.Option("--quick", help="fewer sizes and repeats")] = False,
    warmup: Annotated[int, typer.Option("--warmup", help="untimed runs before timing")] = 5,
    repeats: Annotated[int, typer.Option("--repeats", help="timed runs; the median is kept")] = 20,
) -> None:
    """Time the kernels of a transformer training step on this machine and write a measured profile (needs torch)."""

    from plansim.files.outputs import check_output_file, write_output_text
    from plansim.workload import load_model

    if out is not None:
        check_output_file(out, "--out", inputs=(model,))  # before the timing, not after it
    _require_torch("plansim profile", "pip install 'plansim[profile]'")
    from plansim.profiling.profiler import check_timing, default_out, pick_device, profile_kernels, sweep_sizes

    check_timing(warmup, repeats)
    device = pick_device(device)
    sizes = sweep_sizes(load_model(model), quick=quick, device=device)
    command = "plansim profile " + " ".join(sys.argv[2:]) if len(sys.argv) > 1 else "plansim profile"
    with _progress("profile: kernel groups timed") as bar:
        result = profile_kernels(
            sizes, device=device, dtype=dtype, warmup=warmup, repeats=repeats, quick=quick,
            command=command, progress=bar.counter(), group=lambda label: bar.update(label=label),
        )  # fmt: skip
    path = write_output_text(out or default_out(result), result.to_yaml())
    typer.echo(f"{len(result.points)} kernels timed on {result.environment.device_name}: wrote {path}")


class RematFormat(StrEnum):
    text = "text"
    json = "json"


@app.command()
@_clear_errors
def remat(
    budget: Annotated[str, typer.Option("--budget", "-b", help="activation memory budget: 20GB, 20GiB, 512MB, bytes")],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="preset name (plansim models) or model YAML path")
    ] = None,
    hardware: Annotated[str, typer.Option("--hardware", "-H", help="node type (plansim hardware) or YAML path")] = (
        "dgx-a100"
    ),
    stage_layers: Annotated[
        int | None,
        typer.Option("--stage-layers", "-k", help="schedule the first K blocks (default: 8 at layer, 2 at op)"),
    ] = None,
    graph: Annotated[
        str | None, typer.Option("--graph", help="a node-link JSON/YAML graph (id, cost s, memory B) instead")
    ] = None,
    solver: Annotated[str, typer.Option("--solver", help="MILP solver: highs or cbc")] = "highs",
    time_limit: Annotated[
        float,
        typer.Option(
            "--time-limit",
            help="wall-clock seconds for the MILP at --budget: start search, build and solve (the best schedule "
            "found is reported unproven when it runs out); each budget of the --out curve gets as much, within "
            "--curve-time-limit",
        ),
    ] = 60.0,
    gap: Annotated[float | None, typer.Option("--gap", help="stop within this relative gap, e.g. 0.01")] = None,
    granularity: Annotated[
        str, typer.Option("--granularity", help="op (one node per op) or layer (four per block)")
    ] = "op",
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="sequences per micro-batch")] = 1,
    tp: Annotated[int, typer.Option("--tp", help="tensor-parallel degree (the graph is one rank's)")] = 1,
    out: Annotated[
        str | None, typer.Option("--out", "-o", help="also write the trade-off curve (CSV, PNG, SVG) and schedule here")
    ] = None,
    curve_points: Annotated[
        int,
        typer.Option("--curve-points", help="budgets on the --out trade-off curve (0: write only schedule.json)"),
    ] = 12,
    curve_time_limit: Annotated[
        float,
        typer.Option(
            "--curve-time-limit",
            help="wall-clock seconds for the whole --out curve, shared by its budgets (each at most --time-limit)",
        ),
    ] = 120.0,
    fmt: Annotated[RematFormat, typer.Option("--format", "-f", help="output format")] = RematFormat.text,
) -> None:
    """Which activations to keep and which to recompute within --budget: the Checkmate MILP against the baselines."""
    from plansim.errors import PlansimError, quoted
    from plansim.files.outputs import check_output_folder
    from plansim.limits import number, whole
    from plansim.remat.api import parse_bytes, plan_remat, remat_graph
    from plansim.remat.milp import SOLVERS

    budget_bytes = parse_bytes(budget, "--budget")
    check_output_folder(out)  # before the solves, not after them
    curve_points = whole(curve_points, "curve_points", "--curve-points")
    curve_time_limit = number(curve_time_limit, "time_limit_s", "--curve-time-limit")
    if stage_layers is not None and graph is not None:
        raise PlansimError("--stage-layers and --graph: give one (--graph schedules the file's graph, not the model's)")
    if (model is None) == (graph is None):
        raise PlansimError("give --model (a model's transformer blocks) or --graph (a graph file), one of them")
    if solver not in SOLVERS:
        raise PlansimError(f"--solver {quoted(solver)}: choose one of {', '.join(SOLVERS)}")
    if not time_limit > 0:
        raise PlansimError(f"--time-limit {time_limit}: must be > 0 seconds")
    if gap is not None and not 0 <= gap < 1:
        raise PlansimError(f"--gap {gap}: must be in [0, 1), e.g. 0.01 for 1%")
    g = _timed("remat: building the graph", remat_graph)(
        model,
        hardware,
        stage_layers=stage_layers,
        graph_file=graph,
        micro_batch=micro_batch,
        tp=tp,
        granularity=granularity,
    )
    solving = f"remat: the MILP and the baselines at {budget} ({len(g):,} nodes, time limit {time_limit:g} s)"
    plan = _timed(solving, plan_remat)(g, budget_bytes, solver=solver, time_limit_s=time_limit, gap=gap)
    summary = plan.summary(timings=fmt is RematFormat.text)  # JSON: the same input, the same bytes
    if out is not None:
        curve = (curve_points, curve_time_limit)
        summary["files"] = [str(p) for p in _remat_curve(plan, out, time_limit, gap, solver, curve)]
    if fmt is RematFormat.json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        _print_remat(summary)


def _remat_curve(
    plan: Any, out: str, time_limit: float, gap: float | None, solver: str, curve: tuple[int, float]
) -> list[Any]:
    """The trade-off curve over ``curve[0]`` budgets (``default_budgets``) and the plan's budget, within
    ``curve[1]`` seconds in all (each budget's MILP at most ``time_limit``), with a progress bar on stderr; write it.
    No budgets: the plan's schedule alone."""
    from plansim.remat.api import default_budgets, tradeoff_curve
    from plansim.report.remat_output import write_schedule, write_tradeoff

    g = plan.graph
    points, total_s = curve
    if points == 0:
        return write_schedule(out, g, plan.milp)
    budgets = [b for b in default_budgets(g, points) if abs(b - plan.budget_bytes) > 1e-9 * max(b, 1.0)]
    each_s = min(time_limit, total_s / max(len(budgets), 1))

    def at(k: int) -> str:
        return f"at {budgets[k] / 1e9:.3g} GB (time limit {each_s:.3g} s)" if k < len(budgets) else ""

    with _progress("remat: trade-off curve, budgets solved", len(budgets)) as bar:
        bar.update(label=at(0))
        results = tradeoff_curve(
            g, budgets, solver=solver, time_limit_s=each_s, gap=gap,
            progress=lambda budget: bar.advance(at(bar.done + 1)),
        )  # fmt: skip
    title = f"{g.name}: recompute overhead vs peak memory"
    return write_tradeoff(out, g, [*results, *plan.results], plan.milp, budget_bytes=plan.budget_bytes, title=title)


def _print_remat(s: dict[str, Any]) -> None:
    """The MILP's schedule at the budget and every baseline, as rich tables."""
    from rich.table import Table

    from plansim.report.fit import terminal_console

    console = terminal_console()
    m, graph, budget = s["milp"], s["graph"], s["budget_bytes"]
    total = graph["compute_s"]
    peaks = [r["peak_bytes"] or 0.0 for r in (m, *s["baselines"].values())]
    scale, unit = next((u for u in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")) if max(budget, *peaks) >= u[0]), (1, "B"))

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1e3:,.3f} ms"

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    def size(x: float | None) -> str:
        return "-" if x is None else f"{x / scale:,.3f} {unit}"

    source = f"{s['model']} on {s['hardware']}" if s.get("model") else graph.get("file", graph["name"])
    t = Table(title=f"remat MILP: {source}, budget {size(budget)}", show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    status = m.get("status", "-")
    if m.get("proven_optimal"):
        proven = "[green]yes[/green]" + (f" (within gap {m['gap_limit']:.2%})" if m.get("gap_limit") else "")
    elif status == "feasible":
        proven = "[yellow]no[/yellow]: the time limit came first"
    else:
        proven = "no"
    rows = [
        (
            "graph",
            f"{graph['name']}: {graph['nodes']} nodes ({graph['forward_nodes']} forward), {graph['edges']} edges",
        ),
        ("status", f"{status} ({m.get('solver', '-')})"),
        ("proven optimal", proven),
        *([("note", m["reason"])] if m.get("reason") else []),
        ("objective (total compute)", ms(m.get("objective_s"))),
        ("bound", ms(m.get("bound_s"))),
        ("gap", pct(m.get("gap"))),
        ("recompute time", f"{ms(m['recompute_s'])} ({pct(m['overhead'])} of {ms(total)})"),
        ("peak vs budget", f"{size(m['peak_bytes'])} / {size(budget)}"),
        ("variables / constraints", f"{m.get('variables', 0):,} / {m.get('constraints', 0):,}"),
        ("solve time", f"{m.get('solve_time_s', 0):.2f} s (+{m.get('build_time_s', 0):.2f} s to build)"),
        (
            "nodes recomputed",
            "-"
            if m["recomputed_nodes"] is None
            else f"{m['recomputed_distinct_nodes']} ({m['recomputed_nodes']} recomputations)",
        ),
    ]
    for row in rows:
        t.add_row(*row)
    console.print(t)
    if not s["feasible"]:
        small = s["smallest_baseline_peak"]
        what = "infeasible" if status == "infeasible" else f"no schedule ({status})"
        console.print(
            f"[red]{what}[/red]: no schedule fits {size(budget)}; the smallest baseline peak is "
            f"{size(small['peak_bytes'])} ({small['method']})"
        )
    elif m["recomputed_ops"]:
        r = Table(title=f"first {len(m['recomputed_ops'])} recomputed ops")
        r.add_column("node")
        r.add_column("recomputed for")
        for op in m["recomputed_ops"]:
            r.add_row(_short(op["node"]), _short(op["for"]))
        console.print(r)
    b = Table(title=f"every method at {size(budget)}")
    for col in ("method", "fits", "peak", "recompute", "overhead"):
        b.add_column(col, justify="left" if col in ("method", "fits") else "right")
    for name, r in {"milp": m, **s["baselines"]}.items():
        fits = "[green]yes[/green]" if r["fits"] else "[red]no[/red]"
        b.add_row(name, fits, size(r["peak_bytes"]), ms(r["recompute_s"]), pct(r["overhead"]))
    console.print(b)
    for path in s.get("files", ()):
        console.print(f"wrote {path}")


@app.command("import")
@_clear_errors
def import_model(
    config: Annotated[
        str, typer.Argument(metavar="CONFIG", help="a Hugging Face config.json, or a directory holding one")
    ],
    name: Annotated[
        str | None, typer.Option("--name", "-n", help="model name (default: the file's, or its folder's, name)")
    ] = None,
    seq_len: Annotated[
        int | None,
        typer.Option(
            "--seq-len",
            help="tokens per sequence the model trains at (default: the config's context length, the longest it "
            "supports, which is often longer than the trained one)",
        ),
    ] = None,
    out: Annotated[
        str | None, typer.Option("--out", "-o", help="write a model YAML here (plansim simulate --model FILE)")
    ] = None,
) -> None:
    """Read a Hugging Face config.json (GPT-2, GPT-NeoX, Llama, Mistral, Qwen2) as a plansim model."""
    from pathlib import Path

    from rich.table import Table

    from plansim.files.outputs import check_output_file, write_output_text
    from plansim.report.fit import terminal_console
    from plansim.workload.hf_config import from_hf_config, length_note, model_yaml, read_hf_config, unmodelled

    if out is not None:  # before reading: never the config itself
        check_output_file(out, "--out", inputs=(config, Path(config) / "config.json"))
    spec = from_hf_config(config, name=name, seq_len=seq_len)
    read = read_hf_config(config)
    notes = unmodelled(read, spec)
    table = Table(show_header=False)
    table.add_column("key")
    table.add_column("value", justify="right")
    for key, value in spec.file_fields().items():
        table.add_row(key, f"{value:,}" if type(value) is int else str(value))
    table.add_row("parameters", f"{spec.num_parameters():,}")
    console = terminal_console()
    console.print(f"{spec.name}, from {config}")
    console.print(table)
    console.print(length_note(read, spec, seq_len), markup=False)
    for note in notes:
        console.print(f"not modelled: {note}")
    if out is not None:
        path = write_output_text(out, model_yaml(spec, config, notes))
        console.print(f"wrote {path}: plansim simulate --model {path} ...")


def _short(name: str, width: int = 48) -> str:
    """A merged node's name (``a+b+c+...``) cut to its first and last op."""
    if len(name) <= width or "+" not in name:
        return name
    parts = name.split("+")
    return f"{parts[0]}+…+{parts[-1]}"


def _pairs(values: list[str] | None, option: str, form: str, example: str) -> dict[str, float]:
    """Parse repeated ``KEY=NUMBER`` options; a malformed one, or a key given twice, is a clear error naming the
    option."""
    from plansim.errors import PlansimError, quoted, shown

    out: dict[str, float] = {}
    for value in values or ():
        key, sep, number = value.rpartition("=")
        try:
            if not sep or not key:
                raise ValueError
            factor = float(number)
            if option == "--straggler":
                key = str(int(key))
        except ValueError:
            raise PlansimError(f"{option} {quoted(value)}: expected {form}, e.g. {option} {example}") from None
        if key in out:
            raise PlansimError(f"{option} {shown(key)} is given twice: give each {form.split('=')[0]} once")
        out[key] = factor
    return out


def main() -> None:
    """Entry point of the ``plansim`` script."""
    try:
        app(prog_name="plansim")
    except KeyboardInterrupt:  # pragma: no cover - interactive only
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover - `python -m plansim.cli.app`
    main()
