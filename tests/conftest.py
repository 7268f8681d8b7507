"""Suite-wide setup.

``CliRunner.invoke`` rebuilds the click command from the Typer app on every call (``typer.main.get_command``: some
120 ms, 80% of a small ``simulate``'s in-process run, profiled with cProfile); the command is built once per app
here and reused, as the ``plansim`` process itself uses it once. Click builds a fresh context per invocation, so
reusing the command shares no state between tests.
"""

from __future__ import annotations

import functools

import typer.testing

typer.testing._get_command = functools.cache(typer.testing._get_command)  # type: ignore[attr-defined]
