"""Collection settings shared by the tests and the doctests of ``plansim/``."""

import importlib.util

# Modules that import torch at the top are doctested only where the ``profile`` extra (torch) is installed; their
# tests skip without it (pytest.importorskip).
collect_ignore_glob = [] if importlib.util.find_spec("torch") else ["plansim/profiling/torch_*.py"]
