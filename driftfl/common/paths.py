"""Where driftfl keeps things on disk; each place can be moved with an environment variable."""

import os
from pathlib import Path


def home() -> Path:
    """Run outputs of plain `flwr run` and the launcher's scratch space (DRIFTFL_HOME)."""
    return Path(os.environ.get("DRIFTFL_HOME", Path.home() / ".driftfl"))


def cache_dir() -> Path:
    """Partition indices and other derived files (DRIFTFL_CACHE)."""
    return Path(os.environ.get("DRIFTFL_CACHE", Path.home() / ".cache" / "driftfl"))


def data_dir() -> Path:
    """Where datasets live unless dataset.root says otherwise (DRIFTFL_DATA)."""
    return Path(os.environ.get("DRIFTFL_DATA", cache_dir() / "data"))
