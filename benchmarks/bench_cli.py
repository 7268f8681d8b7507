"""The planner's commands as a user runs them: the whole process of each (start-up, search, the finalists'
discrete-event runs, the explanation and the files written), its wall time and peak memory (issue "a planner that
answers while the user waits": the README's main job under 10 s, goal 5 s; ``--remat milp`` under 20 s;
``--framework all`` under 20 s; the discrete-event engine's ``--mode full`` at 1,024 GPUs under 60 s and 1.5 GB).

With ``--against DIR`` (another checkout of plansim, e.g. ``git worktree add --detach ../prev HEAD~1``) each command
runs alternately with this checkout's code and that one's, ``--repeats`` times each, and the median ratio is
printed: timings on a shared machine compare only within one run.

Run: python benchmarks/bench_cli.py [--against DIR] [--repeats 2] [--only main,milp,all,full]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PLAN = ["plan", "--model", "gpt3-175b", "--hardware", "dgx-a100", "--gpus", "1024", "--global-batch", "1536"]
#: bench_des.py's 1,024-GPU case at 8 micro-batches: at the global batch of 1536 full mode is 30 million tasks, above
#: the default bound (docs/limits.md); at 128 it is 2.5 million, run with the bound raised (``FULL_TASKS``)
FULL_STRATEGY = (
    "dp=16,tp=8,pp=8,micro_batch=1,global_batch=128,schedule=1f1b,sequence_parallel=true,remat=selective,zero=1"
)
FULL_TASKS = "5000000"

#: name -> (command after ``plansim``, whether it writes --out, its target in seconds)
COMMANDS: dict[str, tuple[list[str], bool, float]] = {
    "main": (PLAN, True, 10.0),
    "milp": ([*PLAN, "--remat", "milp"], True, 20.0),
    "all": ([*PLAN, "--framework", "all"], True, 20.0),
    "full": (
        ["simulate", "--model", "gpt3-175b", "--hardware", "dgx-a100", "--gpus", "1024", "--strategy", FULL_STRATEGY,
         "--engine", "des", "--mode", "full"],
        False,
        60.0,
    ),
}  # fmt: skip


def run(root: Path, args: list[str], out: bool) -> tuple[float, float]:
    """One whole ``plansim`` process with ``root``'s code: (wall seconds, its peak RSS in GB)."""
    env = {**os.environ, "PYTHONPATH": str(root), "PLANSIM_PROGRESS": "off", "PLANSIM_MAX_DES_TASKS": FULL_TASKS}
    with tempfile.TemporaryDirectory() as tmp:
        extra = ["--out", str(Path(tmp) / "out")] if out else []
        code = "from plansim.cli.app import main; main()"
        with open(Path(tmp) / "stderr", "w+") as err:
            began = time.perf_counter()
            child = subprocess.Popen(
                [sys.executable, "-c", code, *args, *extra], cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=err
            )
            _, status, usage = os.wait4(child.pid, 0)
            wall = time.perf_counter() - began
            child.returncode = os.waitstatus_to_exitcode(status)
            if child.returncode:
                err.seek(0)
                raise SystemExit(f"{' '.join(args)} failed in {root}: {err.read().strip().splitlines()[-1:]}")
    return wall, usage.ru_maxrss / 1e6  # kB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, help="another checkout to alternate with")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--only", default=",".join(COMMANDS))
    args = parser.parse_args()
    roots = [ROOT] if args.against is None else [ROOT, args.against.resolve()]
    for name in args.only.split(","):
        command, out, target = COMMANDS[name]
        walls: dict[Path, list[float]] = {r: [] for r in roots}
        peaks: dict[Path, float] = dict.fromkeys(roots, 0.0)
        for _ in range(args.repeats):
            for root in roots:
                wall, rss = run(root, command, out)
                walls[root].append(wall)
                peaks[root] = max(peaks[root], rss)
        mine = statistics.median(walls[ROOT])
        line = f"{name}: plansim {' '.join(command)}: {mine:.1f} s (target {target:.0f} s), {peaks[ROOT]:.2f} GB peak"
        if args.against is not None:
            other = args.against.resolve()
            theirs = statistics.median(walls[other])
            line += f"; {args.against}: {theirs:.1f} s, {peaks[other]:.2f} GB; ratio {mine / theirs:.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
