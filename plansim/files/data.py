"""Where the data files live: the repository root for an editable install, ``plansim/_data`` inside a wheel."""

from __future__ import annotations

from pathlib import Path

__all__ = ["data_dir"]

_PACKAGE = Path(__file__).resolve().parents[1]  # plansim/, this module in plansim/files/


def data_dir(name: str) -> Path:
    """The directory of data files called ``name`` (``hardware_profiles`` or ``strategies``).

    A built wheel carries them at ``plansim/_data/<name>``; an editable install reads them from the repository.

    >>> data_dir("hardware_profiles").is_dir()
    True
    """
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"plansim data directory '{name}' not found: reinstall plansim")
