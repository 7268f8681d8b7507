"""A parallel strategy: its schema, the device mesh, the framework profiles' rules and the checks."""
