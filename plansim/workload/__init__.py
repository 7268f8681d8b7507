"""Workloads: model specs (presets, YAML files, Hugging Face ``config.json``, traced torch modules; ``loader``) and
their per-rank op graphs, built by each family's entry in the registry (``families``: GPT, Llama, MLP, ResNet-like
CNN).

>>> from plansim.workload import build_graph, load_model, model_flops
>>> graph = build_graph(load_model("llama3-8b"), micro_batch=1, tp=2)
>>> model_flops(graph) > 0
True
"""

from plansim.workload.build import build_graph
from plansim.workload.graph import MATMUL_KINDS, graph_totals, layer_nodes, model_flops
from plansim.workload.hf_config import from_hf_config
from plansim.workload.loader import list_models, load_model, with_moe_imbalance, with_seq_len
from plansim.workload.spec import ModelSpec
from plansim.workload.torch_trace import TracedModel, trace_module

__all__ = [
    "MATMUL_KINDS",
    "ModelSpec",
    "TracedModel",
    "build_graph",
    "from_hf_config",
    "graph_totals",
    "layer_nodes",
    "list_models",
    "load_model",
    "model_flops",
    "trace_module",
    "with_moe_imbalance",
    "with_seq_len",
]
