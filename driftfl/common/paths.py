"""Where driftfl keeps things on disk; each place can be moved with an environment variable."""

import os
import shutil
import sys
import tempfile
from pathlib import Path

from .errors import ConfigError


def home() -> Path:
    """Run outputs of plain `flwr run` and the launcher's scratch space (DRIFTFL_HOME)."""
    return Path(os.environ.get("DRIFTFL_HOME", Path.home() / ".driftfl"))


def cache_dir() -> Path:
    """Partition indices and other derived files (DRIFTFL_CACHE)."""
    return Path(os.environ.get("DRIFTFL_CACHE", Path.home() / ".cache" / "driftfl"))


def data_dir() -> Path:
    """Where datasets live unless dataset.root says otherwise (DRIFTFL_DATA)."""
    return Path(os.environ.get("DRIFTFL_DATA", cache_dir() / "data"))


def existing_ancestor(folder: Path) -> Path:
    """``folder`` if it exists, else its nearest parent that does."""
    return next(p for p in (folder, *folder.parents) if p.exists())


def cannot_write(folder: Path) -> str | None:
    """Why ``folder`` cannot be created and written, None if it can; leaves nothing behind."""
    try:
        existing = existing_ancestor(folder)
        if not existing.is_dir():
            return f"{existing} is not a directory"
        if existing == folder:
            return None if os.access(folder, os.W_OK | os.X_OK) else "permission denied"
        # only trying tells for sure: not even root can make a folder in /proc
        os.rmdir(tempfile.mkdtemp(dir=existing))
    except OSError as err:
        return (err.strerror or str(err)).lower()
    return None


def console_script(name: str) -> str:
    """A console script of this environment (the venv's bin, beside the interpreter), else from
    PATH: Flower's executables (flwr, flower-superlink, ...)."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise ConfigError(f"'{name}' not found; install Flower with: pip install 'flwr[simulation]'")
    return found
