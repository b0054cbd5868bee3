"""`driftfl report`: many run directories -> a table and plots (command.py says how)."""

from .command import main
from .runs import Run, find_runs
from .table import mean_std

__all__ = ["Run", "find_runs", "main", "mean_std"]
