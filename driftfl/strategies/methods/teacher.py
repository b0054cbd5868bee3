"""Server-side teachers sent with the global model: FedCSD's EMA teacher and FedGKD's mean of
the last M global models. Both update after every aggregation and report their test accuracy."""

from __future__ import annotations

import numpy as np

from driftfl.common.protocol import TEACHER

from driftfl.strategies.parts.aggregation import to_numpy, to_record
from driftfl.strategies.base import DriftStrategy


def ema(teacher: dict[str, np.ndarray], new: dict[str, np.ndarray],
        alpha: float) -> dict[str, np.ndarray]:
    """alpha * teacher + (1 - alpha) * new for floating arrays (parameters and BatchNorm
    statistics alike); integer counters follow ``new``."""
    return {k: (np.asarray(alpha * teacher[k] + (1 - alpha) * v, dtype=v.dtype)
                if v.dtype.kind == "f" else v.copy()) for k, v in new.items()}


def mean_of(models: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Parameter average of models; integer counters from the newest."""
    newest = models[-1]
    return {k: (np.asarray(np.mean([m[k].astype(np.float64) for m in models], axis=0),
                           dtype=v.dtype) if v.dtype.kind == "f" else v.copy())
            for k, v in newest.items()}


class TeacherStrategy(DriftStrategy):
    """Keeps ``self.teacher`` (NumPy arrays) and sends it as the ``teacher`` record."""

    provides = frozenset({TEACHER})
    server_columns = frozenset({"teacher_accuracy"})

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher: dict[str, np.ndarray] | None = None

    def start_teacher(self) -> None:
        """Round 1: the teacher starts as the initial global model."""
        self.teacher = {k: v.copy() for k, v in self.global_arrays.items()}

    def update_teacher(self, new_global: dict[str, np.ndarray]) -> None:
        raise NotImplementedError

    def configure_train(self, server_round, arrays, config, grid):
        if self.teacher is None:
            self.global_arrays = to_numpy(arrays)
            self.start_teacher()
        return super().configure_train(server_round, arrays, config, grid)

    def knowledge(self, server_round: int) -> dict:
        return {TEACHER: to_record(self.teacher)}

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is not None:
            self.update_teacher(to_numpy(arrays))
        return arrays, metrics

    def server_metrics(self, accuracy_of) -> dict[str, float]:
        return {"teacher_accuracy": accuracy_of(self.teacher)} if self.teacher else {}


class EMATeacher(TeacherStrategy):
    """w_teacher <- alpha w_teacher + (1 - alpha) w_G after each round (FedCSD's TMA)."""

    def __init__(self, *, alpha: float, **kwargs):
        super().__init__(**kwargs)
        self.alpha = alpha

    def update_teacher(self, new_global):
        self.teacher = ema(self.teacher, new_global, self.alpha)
