"""Hardware profiles: GPUs, node types and the clusters built from them.

>>> from plansim.hardware import load_hardware
>>> cluster = load_hardware("dgx-h100", gpus=64)
>>> cluster.num_nodes, cluster.gpu.peak_flops("fp8") / 1e12
(8, 1978.9)
"""

from plansim.hardware.cluster import Cluster
from plansim.hardware.link import Link
from plansim.hardware.loader import list_hardware, load_gpu, load_hardware, load_node, resize
from plansim.hardware.schema import GPUSpec, NodeSpec
from plansim.hardware.topology import build_topology, link_tier

__all__ = [
    "Cluster",
    "GPUSpec",
    "Link",
    "NodeSpec",
    "build_topology",
    "link_tier",
    "list_hardware",
    "load_gpu",
    "load_hardware",
    "load_node",
    "resize",
]
