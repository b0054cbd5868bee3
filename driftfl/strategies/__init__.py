"""Server-side strategies by name: Flower's where Flower has them, extended by DriftStrategy."""

from __future__ import annotations

import logging

import numpy as np
from flwr.serverapp import strategy as flwr_strategy
from omegaconf import DictConfig
from torch import nn

from driftfl.common.errors import ConfigError, lookup
from driftfl.common.protocol import OBJECTIVES

from .aggregation import to_numpy, to_record
from .base import DriftStrategy
from .fednova import FedNova


class FedAvg(DriftStrategy):
    pass


class FedProx(flwr_strategy.FedProx, DriftStrategy):
    """Flower's FedProx (it sends ``proximal-mu``); the client's ``prox`` objective adds the term."""


class FedAvgM(flwr_strategy.FedAvgM, DriftStrategy):
    """Flower's server momentum, applied to DriftStrategy's checked average."""

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None:
            return arrays, metrics
        # Flower's momentum step turns integer buffers (BatchNorm's num_batches_tracked) into
        # float arrays of another shape; keep every array's dtype and shape, and counters as
        # the checked average has them.
        fixed = {}
        for key, value in to_numpy(arrays).items():
            ref = self.global_arrays[key]
            fixed[key] = (self.last_aggregate[key] if ref.dtype.kind != "f"
                          else np.asarray(value, dtype=ref.dtype).reshape(ref.shape))
        return to_record(fixed), metrics


def _non_negative(params: DictConfig, key: str) -> float:
    value = params.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"strategy.{key} must be a number >= 0, got {value!r}")
    return float(value)


def _fedprox_args(params, cfg, model):
    return {"proximal_mu": _non_negative(params, "mu")}


def _fedavgm_args(params, cfg, model):
    if not _non_negative(params, "server_momentum") < 1:
        raise ConfigError(f"strategy.server_momentum must be in [0, 1), got {params.server_momentum}")
    return {"server_learning_rate": _non_negative(params, "server_lr"),
            "server_momentum": float(params.server_momentum)}


# name -> (class, extra constructor arguments from the strategy's config)
STRATEGIES = {
    "fedavg": (FedAvg, None),
    "fedprox": (FedProx, _fedprox_args),
    "fedavgm": (FedAvgM, _fedavgm_args),
    "fednova": (FedNova, None),
}


def check_strategy(cfg: DictConfig) -> None:
    """Raise ConfigError for an unknown strategy or objective, or bad parameters."""
    build_strategy(cfg, None)


def build_strategy(cfg: DictConfig, model: nn.Module | None) -> DriftStrategy:
    """The strategy ``cfg.strategy`` names, configured for this experiment."""
    params = cfg.strategy
    cls, extra_args = lookup("strategy", params.name, STRATEGIES)
    objective = str(params.get("objective", "ce"))
    lookup("objective", objective, dict.fromkeys(OBJECTIVES))
    if objective == "prox":
        _non_negative(params, "mu")
    kwargs = extra_args(params, cfg, model) if extra_args else {}
    flwr_logger = logging.getLogger("flwr")
    level = flwr_logger.level
    flwr_logger.setLevel(logging.ERROR)  # Flower warns of settings we chose on purpose (mu=0, ...)
    try:
        strategy = cls(fraction_train=float(cfg.fraction),
                       fraction_evaluate=float(cfg.get("fraction_evaluate", 0.0)),
                       min_train_nodes=1, min_evaluate_nodes=0,
                       min_available_nodes=int(cfg.num_clients), **kwargs)
    finally:
        flwr_logger.setLevel(level)
    strategy.objective, strategy.seed = objective, int(cfg.seed)
    if isinstance(strategy, FedNova):
        strategy.momentum = float(cfg.momentum)
        if model is not None:
            strategy.param_keys = frozenset(name for name, _ in model.named_parameters())
    return strategy


__all__ = ["STRATEGIES", "DriftStrategy", "FedAvg", "FedAvgM", "FedNova", "FedProx",
           "build_strategy", "check_strategy"]
