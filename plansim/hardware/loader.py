"""Find, read and validate hardware profiles: ``hardware_profiles/gpus/<stem>.yaml`` and ``nodes/<stem>.yaml``.

Nothing is read at import time. Validated profiles are cached by path and modification time, so repeated loads are
cheap and an edited file is read again. ``load_hardware`` sizes a node type's cluster to a GPU count; ``resize`` gives
a loaded cluster another count.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from plansim.errors import PlansimError, quoted, shown, shown_path
from plansim.files.data import data_dir
from plansim.files.yamlfile import is_file, looks_like_path, read_mapping, record_input, refuse_special, validated
from plansim.hardware.cluster import Cluster
from plansim.hardware.schema import GPUSpec, NodeSpec
from plansim.limits import whole

__all__ = ["list_hardware", "load_gpu", "load_hardware", "load_node", "resize"]

_Model = TypeVar("_Model", bound=BaseModel)


def _profiles(kind: str) -> Path:
    return data_dir("hardware_profiles") / kind


def _known(kind: str) -> list[str]:
    return sorted(p.stem for p in _profiles(kind).glob("*.yaml"))


def _resolve(name: str | Path, kind: str, what: str) -> Path:
    """Map a case-insensitive profile name, or a path to a YAML file, to the file."""
    if isinstance(name, Path) or looks_like_path(name):
        path = Path(name)
        if not is_file(path):
            refuse_special(path, what)  # a FIFO, a folder, a symlink loop: said so, not "not found"
            raise PlansimError(f"{what} file '{shown_path(path)}' not found: check the path")
        return path
    path = _profiles(kind) / f"{name.lower()}.yaml"
    if not is_file(path):
        raise PlansimError(
            f"unknown {what} '{shown(name)}': known {what} profiles are {', '.join(_known(kind))} (or pass a path to "
            "a YAML file)"
        )
    return path


def _validated(path: Path, model: type[_Model]) -> _Model:
    record_input(path)  # an input of the command even when the cache answers
    return _validated_cached(path, path.resolve().stat().st_mtime_ns, model)


@lru_cache(maxsize=256)
def _validated_cached(path: Path, mtime_ns: int, model: type[_Model]) -> _Model:
    """Parse and validate once per file version; the models are frozen, so sharing them is safe."""
    return validated(model, read_mapping(path, "hardware profile"), shown_path(path))


def load_gpu(name: str | Path) -> GPUSpec:
    """Load a GPU profile by name (the file stem, any case) or by path.

    Parameters
    ----------
    name
        ``"a100-sxm4-80gb"``, ``"A100-SXM4-80GB"`` or a path to a GPU YAML file.

    Raises
    ------
    PlansimError
        Unknown name (the message lists the known ones), malformed YAML or a schema violation.

    Examples
    --------
    >>> load_gpu("H100-SXM5-80GB").memory_bytes // 2**30
    80
    """
    return _validated(_resolve(name, "gpus", "GPU"), GPUSpec)


def load_node(name: str | Path) -> NodeSpec:
    """Load a node-type profile by name (the file stem, any case) or by path, without its GPU.

    >>> load_node("dgx-h100").gpus_per_node
    8
    """
    return _validated(_resolve(name, "nodes", "hardware"), NodeSpec)


def _gpu_of(node: NodeSpec, node_path: Path) -> GPUSpec:
    """The node's GPU: ``gpus/<stem>.yaml`` beside the node file's folder first, then the built-in profiles."""
    stem = node.gpu.lower()
    for folder in (node_path.resolve().parent.parent / "gpus", _profiles("gpus")):
        if is_file(folder / f"{stem}.yaml"):
            return load_gpu(folder / f"{stem}.yaml")
    raise PlansimError(
        f"{shown_path(node_path)}: field 'gpu': unknown GPU '{shown(node.gpu)}': "
        f"use one of {', '.join(_known('gpus'))} "
        f"or add gpus/{stem}.yaml"
    )


def load_hardware(name: str | Path, gpus: int | None = None) -> Cluster:
    """Load a node type and size a cluster of it.

    Parameters
    ----------
    name
        Node type (``"dgx-a100"``, any case) or a path to a node YAML file.
    gpus
        Total GPUs; defaults to one node. At most one node's worth, or a whole number of nodes.

    Raises
    ------
    PlansimError
        Unknown name, bad file, unknown GPU reference, or a GPU count that is not positive, not a whole number of
        nodes, or larger than the fabric reaches.

    Examples
    --------
    >>> cluster = load_hardware("DGX-A100", gpus=1024)
    >>> cluster.num_nodes, cluster.gpu.name
    (128, 'A100-SXM4-80GB')
    """
    if not isinstance(name, str | Path):
        raise PlansimError(f"hardware: expected a node type (plansim hardware) or a YAML path, got {shown(repr(name))}")
    path = _resolve(name, "nodes", "hardware")
    node = _validated(path, NodeSpec)
    gpu = _gpu_of(node, path)
    _check_collective_library(node, gpu, path)
    return Cluster(node=node, gpu=gpu, num_gpus=_check_gpus(node, gpus))


def _check_collective_library(node: NodeSpec, gpu: GPUSpec, path: Path) -> None:
    """Refuse what the NCCL models cannot price on an AMD GPU, whose collectives run on RCCL: NCCL's call timing
    (``plansim.costs.nccl`` transcribes NVIDIA NCCL's tuner; RCCL's is its own, ROCm/rccl src/graph/tuning.cc) and
    NVLink SHARP (an NVSwitch feature)."""
    section = node.nccl
    if gpu.vendor != "amd" or section is None:
        return
    where = f"{shown_path(path)}: field"
    if section.timed:
        raise PlansimError(
            f"{where} 'nccl.arch': {gpu.name} ({gpu.architecture}) runs RCCL, whose tuning plansim's NCCL call timing "
            "does not model: remove arch, channel_bw_intra_GBps, channel_bw_inter_GBps, call_us and sync_us "
            "(collectives then keep the alpha-beta latency)"
        )
    if section.nvls_channels:
        raise PlansimError(
            f"{where} 'nccl.nvls_channels': {gpu.name} ({gpu.architecture}) has no NVLink SHARP: set it to 0"
        )


def resize(cluster: Cluster, gpus: int) -> Cluster:
    """The same node type (and GPU) with ``gpus`` GPUs, checked as ``load_hardware`` checks them; works for node
    types loaded from a file as well as shipped ones.

    >>> resize(load_hardware("dgx-a100"), 64).num_nodes
    8
    """
    return Cluster(node=cluster.node, gpu=cluster.gpu, num_gpus=_check_gpus(cluster.node, gpus))


def _check_gpus(node: NodeSpec, gpus: int | None) -> int:
    per_node = node.gpus_per_node
    if gpus is None:
        return per_node
    integral = isinstance(gpus, int) or (isinstance(gpus, float) and gpus.is_integer())  # 8.0 as simulate takes it
    if isinstance(gpus, bool) or not integral:
        raise PlansimError(f"gpus must be a whole number, got {quoted(gpus)}")
    if gpus <= 0:
        raise PlansimError(f"gpus must be positive, got {shown(gpus)}: ask for at least 1 GPU")
    gpus = whole(gpus, "gpus", "gpus")  # an int, at most plansim.limits' largest cluster
    if gpus > per_node and gpus % per_node:
        raise PlansimError(
            f"{node.name} has {per_node} GPUs per node: gpus={gpus} is not a whole number of nodes "
            f"(use a multiple of {per_node}, or at most {per_node})"
        )
    nodes = -(-gpus // per_node)
    if nodes > node.max_nodes:
        raise PlansimError(
            f"{node.name}: gpus={gpus} needs {nodes} nodes but the fabric reaches {node.max_nodes:g}: "
            f"ask for fewer GPUs or add an outer fabric tier"
        )
    return gpus


def list_hardware() -> list[dict[str, Any]]:
    """One row per built-in node type, for ``plansim hardware`` and notebooks.

    Returns
    -------
    list of dict
        Keys: ``name``, ``gpu``, ``gpus_per_node``, ``gpu_memory_GB``, ``intra_node`` (topology),
        ``intra_node_GBps`` (per GPU, per direction), ``allreduce_busbw_GBps``, ``nics`` and ``nic_GBps``.

    Examples
    --------
    >>> [row["name"] for row in list_hardware()][:2]
    ['dgx-1', 'dgx-a100']
    """
    rows = []
    for stem in _known("nodes"):
        cluster = load_hardware(stem)
        node, gpu = cluster.node, cluster.gpu
        rows.append(
            {
                "name": node.name,
                "gpu": gpu.name,
                "gpus_per_node": node.gpus_per_node,
                "gpu_memory_GB": round(gpu.memory_bytes / 1e9, 1),
                "intra_node": node.intra_node.topology,
                "intra_node_GBps": node.intra_node.bandwidth_per_gpu_Bps / 1e9,
                "allreduce_busbw_GBps": node.intra_node.allreduce_busbw_Bps / 1e9,
                "nics": f"{node.nics.count} x {node.nics.bandwidth_Bps * 8 / 1e9:g} Gb/s",
                "nic_GBps": node.nics.bandwidth_Bps / 1e9,
            }
        )
    return rows
