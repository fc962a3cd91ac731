"""The version of the module, as it is installed or as the source tree's pyproject.toml says."""

from __future__ import annotations

import pathlib
import tomllib
from importlib import metadata


def version() -> str:
    """The installed package's version, or pyproject's when running from a source tree."""
    try:
        return metadata.version("deckhouse-peering")
    except metadata.PackageNotFoundError:
        pass
    pyproject = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"
    try:
        return tomllib.loads(pyproject.read_text())["project"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "0+unknown"
