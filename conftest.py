"""Collection settings shared by the tests and the doctests of ``plansim/``."""

import importlib.util

# Modules that import torch at the top are doctested only where the ``profile`` extra (torch) is installed; their
# tests skip without it (pytest.importorskip).
_NEED_TORCH = ["plansim/profiling/torch_models.py", "plansim/profiling/profiler.py"]
collect_ignore = [] if importlib.util.find_spec("torch") else _NEED_TORCH
