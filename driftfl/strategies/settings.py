"""What every strategy's own settings share (a method's ``strategy`` section, server half)."""

from __future__ import annotations

from driftfl.common.settings import Settings


class StrategySettings(Settings):
    """A strategy's own settings: the server's half of a method's ``strategy`` section."""

    def aux_set_per_class(self) -> int:
        """Training samples per class the server keeps back as its aux set (0: none)."""
        return 0
