"""The analytic engine: one training step in closed form."""
