"""The ``plansim`` command line (typer) and its one-line usage errors."""
