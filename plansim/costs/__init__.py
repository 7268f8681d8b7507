"""The one cost model both engines use: kernels (measured or roofline), collectives as transfer schedules, per-layer
costs of a workload graph, and the analytic memory model."""
