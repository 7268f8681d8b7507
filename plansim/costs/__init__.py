"""The one cost model both engines use: kernels (measured or roofline), collectives as transfer schedules, NCCL's own
model and a cluster's groups as NCCL sees them, compute slowed beside communication, stragglers, remat policies, and
memory (ZeRO's model states, NCCL's buffers, the caching allocator's rounding)."""
