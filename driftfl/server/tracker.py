"""Per-round metrics streamed as they are recorded, to watch a long run from outside.

``tracker=tensorboard`` writes TensorBoard event files to ``<run dir>/tensorboard``: every
numeric column of metrics.csv (test accuracy and loss, per-class accuracy, the clients' means,
seconds, bytes, ...) as a scalar whose step is the round. Watch with
``tensorboard --logdir outputs`` (every run under it) while the run goes on.
"""

from __future__ import annotations

from pathlib import Path


class TensorBoardTracker:
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def add_round(self, flat_row: dict) -> None:
        """One round's row, its lists and dicts already flattened into columns."""
        step = int(flat_row["round"])
        for key, value in flat_row.items():
            if key != "round" and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()  # readable at once, not when the run ends

    def close(self) -> None:
        self.writer.close()


def make_tracker(name: str, run_dir: Path) -> TensorBoardTracker | None:
    return TensorBoardTracker(run_dir) if name == "tensorboard" else None
