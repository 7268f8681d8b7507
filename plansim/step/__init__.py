"""The training step, defined once for both engines: what they derive first (``prepare``: the checked strategy, the
op graph and the kernel model, and the quantities both read), and what a stage holds for the whole step (``memory``).
The analytic engine is the closed form of what the lowering builds task by task."""
