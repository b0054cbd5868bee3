"""FedGKD's server: the teacher is the average of the last M global models."""

from __future__ import annotations

from collections import deque

import numpy as np

from driftfl.specs import methods as declared
from driftfl.strategies.methods.teacher import TeacherStrategy, mean_of


class FedGKD(TeacherStrategy):
    """Teacher = parameter average of the last ``buffer_size`` global models, the initial one
    included; round 1 sends none (its teacher would be the untrained initial model)."""

    spec = declared.FEDGKD

    def __init__(self, *, buffer_size: int, **kwargs):
        super().__init__(**kwargs)
        self.buffer_size = buffer_size
        self.buffer: deque[dict[str, np.ndarray]] = deque(maxlen=buffer_size)

    @classmethod
    def arguments(cls, settings, *, model, aux_set, **_):
        return {"buffer_size": settings.buffer_size}

    def start_teacher(self) -> None:
        self.buffer = deque([{k: v.copy() for k, v in self.global_arrays.items()}],
                            maxlen=self.buffer_size)
        self.teacher = mean_of(list(self.buffer))

    def update_teacher(self, new_global):
        self.buffer.append({k: v.copy() for k, v in new_global.items()})
        self.teacher = mean_of(list(self.buffer))

    def knowledge(self, server_round: int) -> dict:
        return {} if server_round == 1 else super().knowledge(server_round)
