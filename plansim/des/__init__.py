"""The discrete-event simulator: task graph, engine and per-device state."""
