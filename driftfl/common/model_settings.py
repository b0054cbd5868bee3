"""The ``model`` section's settings, importable without torch: what every model takes and the
built-in models' own. driftfl.common.models registers the built-ins with these (and imports
torch); `driftfl run` checks a built-in model's values against them before it imports anything
heavy (experiment_settings.settings_problem). A user's own model (driftfl/models/) declares its
settings beside its builder, so only the full check knows them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .settings import MANY, Settings


class ModelSettings(Settings):
    """The ``model`` section; most models take nothing more than their name."""

    name: str
    projection: int = Field(0, ge=0, le=MANY, description=(
        "MOON's projection head, for any model: 0 none; n > 0: Linear(d, d) - ReLU - "
        "Linear(d, n) after the features, which then return the projection the head "
        "classifies"))


class MlpSettings(ModelSettings):
    hidden: list[Annotated[int, Field(ge=1, le=MANY)]] = Field(
        [200, 200], description="widths of the hidden layers (FedAvg's 2NN: [200, 200])")


# the built-in models' settings by name (driftfl.common.models registers each with its own;
# a test keeps the two equal); a user's model is not here
BUILT_IN_MODELS: dict[str, type[ModelSettings]] = {
    "mlp": MlpSettings, "cnn": ModelSettings, "lenet5": ModelSettings,
    "convnet": ModelSettings, "resnet18": ModelSettings}
