"""The ``dataset`` section's settings, importable without torch: the schema each dataset's name
selects. driftfl.common.datasets pairs each with its loader (and imports torch); `driftfl run`
checks a dataset's values against these before it imports anything heavy
(experiment_settings.settings_problem).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field

from .settings import MANY, Settings, section


class DatasetSettings(Settings):
    """The ``dataset`` section every dataset takes."""

    name: str
    root: str | None = Field(None, description=(
        "where the dataset is; null: the dataset's default place, under the data directory "
        "($DRIFTFL_DATA; fmnist looks in /usr/share/datasets/fashion-mnist first)"))
    download: bool = Field(False, description=(
        "fetch it with torchvision when missing (needs internet)"))
    subset: int | None = Field(None, ge=1, le=MANY, description=(
        "use only the first N training samples (quick runs); null: all"))
    test_subset: int | None = Field(None, ge=1, le=MANY, description=(
        "evaluate on only the first N test samples; null: all"))


class EmnistSettings(DatasetSettings):
    split: Literal["balanced", "byclass", "bymerge", "digits", "letters", "mnist"] = Field(
        "balanced", description="which of EMNIST's splits")


class OwnDataSettings(DatasetSettings):
    """A user's own data (a folder of images or an .npz file): ``root`` names it."""

    root: str = Field(description=(
        "required: your data, a folder of images in the ImageFolder layout (folder) or an "
        ".npz file (npz)"))
    test_fraction: float = Field(0.2, gt=0, lt=1, description=(
        "share of the training data held out for testing where the data has no test split"))


class FolderSettings(OwnDataSettings):
    image_size: int = Field(32, ge=1, le=4096, description=(
        "images are resized to image_size x image_size"))
    channels: Literal[1, 3] = Field(3, description="1 (grayscale) or 3 (RGB)")


# name -> its settings; driftfl.common.datasets.DATASETS adds each one's loader
DATASET_SETTINGS: dict[str, type[DatasetSettings]] = {
    "fmnist": DatasetSettings, "mnist": DatasetSettings, "emnist": EmnistSettings,
    "cifar10": DatasetSettings, "cifar100": DatasetSettings, "svhn": DatasetSettings,
    "folder": FolderSettings, "npz": OwnDataSettings,
}


def dataset_settings(spec: Mapping | DatasetSettings) -> DatasetSettings:
    """A ``dataset`` section, checked against its dataset's settings."""
    return section("dataset", spec, DATASET_SETTINGS)
