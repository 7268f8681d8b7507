"""Fit NCCL's per-call and per-synchronisation costs (``plansim.costs.nccl.NcclTuning``) to a published nccl-tests
curve, and print the model against every point. With ``--nvls``, fit an NVLS all-reduce's per-call and per-loop costs
(``plansim.costs.nccl.NvlsTuning``) instead, on the sizes where NCCL's own model picks NVLS over the ring (NCCL's
default, ``NCCL_ALGO`` unset), the ring keeping the node profile's constants.

The fit minimises the squared error in log bus bandwidth over the message sizes where NCCL's default runs the ring
(every size on A100; on H100, below the NVLS crossover, all LL: the protocols no size uses keep the A100 fit), by a
grid search refined around its best point; NCCL's own model picks the protocol of each call (so the fit does not
choose it). Only a
micro-benchmark of the collective alone is read (``calibration/*.yaml``), never a training run.

Run: python scripts/fit_nccl.py [calibration/nccl-tests-a100.yaml | calibration/nccl-tests-h100.yaml]
     python scripts/fit_nccl.py --nvls [calibration/nccl-tests-h100.yaml]
"""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

from plansim.costs.nccl import PROTOCOLS, NcclComm, NcclTuning, NvlsTuning, choose, tuned_call
from plansim.costs.nccl_groups import nccl_comm
from plansim.files.yamlfile import parse_yaml, read_text
from plansim.hardware import load_hardware

ROOT = Path(__file__).resolve().parent.parent


def load_curve(path: Path) -> dict:
    return parse_yaml(read_text(path, "nccl-tests curve"), str(path))


def _default_comm(curve: dict) -> tuple[NcclComm, NvlsTuning | None]:
    """The curve's communicator as NCCL sees it (NVLS with the node's NVLS graph and fit where it has one); read
    once per curve (the fit asks for every tuning it tries)."""
    key = (curve["node"], curve["ranks"], curve["nodes"], curve.get("cpu"))
    if key not in _COMMS:
        _COMMS[key] = _read_comm(curve)
    return _COMMS[key]


_COMMS: dict[tuple, tuple[NcclComm, NvlsTuning | None]] = {}


def _read_comm(curve: dict) -> tuple[NcclComm, NvlsTuning | None]:
    cluster = load_hardware(curve["node"], gpus=curve["ranks"])
    section = cluster.node.nccl
    comm = nccl_comm(cluster, curve["ranks"], curve["nodes"], cpu=curve.get("cpu"))
    if section is None or not section.nvls_timed:
        return comm, None
    bw = {"nvls_bw_intra": section.nvls_bw_intra_GBps or 0.0, "nvls_bw_inter": section.nvls_bw_inter_GBps or 0.0}
    assert section.nvls_call_us is not None and section.nvls_sync_us is not None
    nvls = NvlsTuning(section.nvls_call_us, section.nvls_sync_us)
    return NcclComm(**{**comm.__dict__, **bw, "nvls_channels": section.nvls_channels}), nvls


def errors(curve: dict, tuning: NcclTuning) -> dict[int, tuple[str, float, float]]:
    """Per size where NCCL's default picks the ring (every size on a node without NVLS): the protocol NCCL's model
    picks, the model's ring bus bandwidth, the measured one."""
    comm, nvls = _default_comm(curve)
    ring_comm = NcclComm(**{**comm.__dict__, "nvls_channels": 0})
    out = {}
    for size, measured in curve["busbw_GBps"].items():
        if nvls is not None and tuned_call(comm, curve["collective"], float(size), tuning, nvls).algorithm != "ring":
            continue
        call = tuned_call(ring_comm, curve["collective"], float(size), tuning, algorithms=("ring",))
        out[int(size)] = (call.protocol, call.busbw_GBps, measured)
    return out


def loss(curve: dict, tuning: NcclTuning) -> tuple[float, float]:
    """The sum of squared errors in log bus bandwidth over the curve's ring sizes, then the worst (ties). Least
    squares, not the worst error: a point the model's structure cannot reach (LL128's mid sizes,
    docs/network-model.md) would otherwise set every constant."""
    logs = [math.log(b / m) for _, b, m in errors(curve, tuning).values()]
    return sum(x * x for x in logs), max(abs(x) for x in logs)


#: Where the LL128 thread block's rate is not fitted: above any channel's NCCL figure, so it never binds.
_NO_CAP = 1e3


def fit(curve: dict, base: NcclTuning | None = None) -> NcclTuning:
    """``call_us`` and the ``sync_us`` of every protocol NCCL's model picks at some ring size of the curve, and the
    LL128 rate of a channel's thread block where LL128 is one of them; a protocol picked at none keeps ``base``'s
    sync (the H100 curve's ring sizes are all LL: its LL128 and Simple costs are the A100 fit's), but not its LL128
    rate, which is the GPU's own (left to NCCL's figure)."""
    used = {p for p, _, _ in errors(curve, NcclTuning(0.0, (0.0, 0.0, 0.0))).values()}
    free = [True] + [p in used for p in PROTOCOLS] + ["LL128" in used]
    if base is None and not all(free[:4]):
        raise SystemExit(f"the curve's ring sizes use only {sorted(used)}: give a base fit for the others")
    start = [0.0, 0.0, 0.0, 0.0, _NO_CAP] if base is None else [base.call_us, *base.sync_us, _NO_CAP]
    grid = [[0, 5, 10, 15, 20, 25, 30, 35, 40], [0, 0.5, 1, 1.5, 2, 3, 4, 6], [0, 1, 2, 3, 4, 6, 8, 12],
            [0, 2, 4, 6, 8, 10, 12], [4, 6, 8, 10, _NO_CAP]]  # fmt: skip
    axes = [g if f else [v] for g, f, v in zip(grid, free, start, strict=True)]

    def tuning(v: list[float]) -> NcclTuning:
        return NcclTuning(v[0], (v[1], v[2], v[3]), None if v[4] >= _NO_CAP else v[4])

    def values_of(t: NcclTuning) -> list[float]:
        return [t.call_us, *t.sync_us, t.ll128_channel_GBps or _NO_CAP]

    best = min((tuning(list(v)) for v in itertools.product(*axes)), key=lambda t: loss(curve, t))
    step = [2.5, 0.125, 0.5, 1.0, 1.0]
    for _ in range(40):  # coordinate descent with a halving step
        improved = False
        for i in (i for i in range(5) if free[i]):
            for sign in (-1, 1):
                values = values_of(best)
                if i == 4 and values[4] >= _NO_CAP:
                    values[4] = 10.0  # step down from "no cap" to a cap just above NCCL's A100 figure
                values[i] = max(0.0, values[i] + sign * step[i])
                trial = tuning(values)
                if loss(curve, trial) < loss(curve, best):
                    best, improved = trial, True
        if not improved:
            step = [s / 2 for s in step]
    return _ll128_sync_prior(curve, best)


def _ll128_sync_prior(curve: dict, t: NcclTuning) -> NcclTuning:
    """Where every LL128 size of the curve is data-bound, its LL128 sync is not identified (any value below a step's
    data fits as well): take LL's, the same store-to-poll latency of a flagged line over NVLink (src/device/prims_ll.h,
    prims_ll128.h), if the fit is unchanged by it."""
    ll, ll128, simple = t.sync_us
    if ll128 >= ll:
        return t
    prior = NcclTuning(t.call_us, (ll, ll, simple), t.ll128_channel_GBps)
    return prior if loss(curve, prior) == loss(curve, t) else t


def _nvls_setup(curve: dict) -> tuple[NcclComm, NcclTuning]:
    cluster = load_hardware(curve["node"], gpus=curve["ranks"])
    section = cluster.node.nccl
    assert section is not None and section.call_us is not None and section.sync_us is not None
    bw = {"nvls_bw_intra": section.nvls_bw_intra_GBps or 0.0, "nvls_bw_inter": section.nvls_bw_inter_GBps or 0.0}
    comm = nccl_comm(cluster, curve["ranks"], curve["nodes"], cpu=curve.get("cpu"))
    comm = NcclComm(**{**comm.__dict__, **bw, "nvls_channels": section.nvls_channels})
    return comm, NcclTuning(section.call_us, section.sync_us, section.ll128_channel_GBps)


def nvls_errors(curve: dict, tuning: NvlsTuning) -> dict[int, tuple[str, float, float]]:
    """Per size: the algorithm NCCL's model picks, the model's bus bandwidth, the measured one."""
    comm, ring = _nvls_setup(curve)
    out = {}
    for size, measured in curve["busbw_GBps"].items():
        call = tuned_call(comm, curve["collective"], float(size), ring, tuning)
        out[int(size)] = (call.algorithm, call.busbw_GBps, measured)
    return out


def nvls_loss(curve: dict, tuning: NvlsTuning) -> tuple[float, float]:
    """The worst relative error in log bus bandwidth over the sizes NCCL runs as NVLS, then the sum of squares."""
    logs = [math.log(b / m) for a, b, m in nvls_errors(curve, tuning).values() if a == "nvls"]
    return max(abs(x) for x in logs), sum(x * x for x in logs)


def fit_nvls(curve: dict) -> NvlsTuning:
    comm, _ = _nvls_setup(curve)
    if not any(choose(comm, "all_reduce", float(s), algorithms=("ring", "nvls")).algorithm == "nvls"
               for s in curve["busbw_GBps"]):  # fmt: skip
        raise SystemExit("NCCL's model picks NVLS at no size of this curve")
    grid = {"call": [0, 10, 20, 30, 40, 50, 60, 80, 100], "sync": [0, 0.25, 0.5, 1, 2, 4, 8]}
    best = min((NvlsTuning(c, y) for c, y in itertools.product(*grid.values())), key=lambda t: nvls_loss(curve, t))
    step = [5.0, 0.125]
    for _ in range(40):  # coordinate descent with a halving step
        improved = False
        for i in range(2):
            for sign in (-1, 1):
                values = [best.call_us, best.sync_us]
                values[i] = max(0.0, values[i] + sign * step[i])
                trial = NvlsTuning(values[0], values[1])
                if nvls_loss(curve, trial) < nvls_loss(curve, best):
                    best, improved = trial, True
        if not improved:
            step = [s / 2 for s in step]
    return best


def main_nvls(path: Path) -> None:
    curve = load_curve(path)
    tuning = fit_nvls(curve)
    print(f"nvls_call_us {tuning.call_us:.2f}, nvls_sync_us {tuning.sync_us:.3f}")
    for size, (algo, model, measured) in nvls_errors(curve, tuning).items():
        err = model / measured - 1
        print(f"{size:>12,} B  {algo:<5} model {model:7.2f} GB/s  measured {measured:7.2f} GB/s  {err:+6.1%}")


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--nvls"]:
        main_nvls(Path(args[1]) if len(args) > 1 else ROOT / "calibration/nccl-tests-h100.yaml")
        return
    path = Path(args[0]) if args else ROOT / "calibration/nccl-tests-a100.yaml"
    curve = load_curve(path)
    base = None if path.name == "nccl-tests-a100.yaml" else fit(load_curve(ROOT / "calibration/nccl-tests-a100.yaml"))
    tuning = fit(curve, base)
    print(f"call_us {tuning.call_us:.2f}, sync_us LL {tuning.sync_us[0]:.3f}, LL128 {tuning.sync_us[1]:.3f}, "
          f"Simple {tuning.sync_us[2]:.3f}, ll128_channel_GBps {tuning.ll128_channel_GBps}")  # fmt: skip
    worst = 0.0
    for size, (proto, model, measured) in errors(curve, tuning).items():
        err = model / measured - 1
        worst = max(worst, abs(err))
        print(f"{size:>12,} B  {proto:<6} model {model:7.2f} GB/s  measured {measured:7.2f} GB/s  {err:+6.1%}")
    print(f"worst error {worst:.1%}")


if __name__ == "__main__":
    main()
