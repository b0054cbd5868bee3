"""Strategies by name, each with the settings it takes from ``cfg.strategy`` (checked here, so a
bad value stops the run before any training)."""

from __future__ import annotations

import logging

import numpy as np
from flwr.serverapp import strategy as flwr_strategy
from omegaconf import DictConfig
from torch import nn

from driftfl.common.errors import ConfigError, lookup
from driftfl.common.protocol import CLASS_PHI, OBJECTIVE_NEEDS, OBJECTIVES

from .aggregation import to_numpy, to_record
from .auxiliary import AuxiliarySet
from .base import DriftStrategy
from .fedcad import FedCAD
from .fedcsd import FedCSD
from .fednova import FedNova
from .fedssd import FedSSD
from .teacher import FedGKD


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


def _number(params: DictConfig, key: str, low: float = 0.0, high: float = float("inf"),
            low_open: bool = False, high_open: bool = False) -> float:
    value = params.get(key)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (value > low if low_open else value >= low)
    ok = ok and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ConfigError(f"strategy.{key} must be a number in {interval}, got {value!r}")
    return float(value)


def _objective_params(params: DictConfig, objective: str) -> None:
    """The local objective's own settings, checked before any client sees them."""
    if objective == "prox":
        _number(params, "mu")
    elif objective == "csd":
        _number(params, "mu")
        _number(params, "tau", low_open=True)
        lookup("strategy.mask", str(params.get("mask")),
               dict.fromkeys(("adaptive", "forcible", "off")))
        if not isinstance(params.get("similarity"), bool):
            raise ConfigError(f"strategy.similarity must be true or false, "
                              f"got {params.get('similarity')!r}")
    elif objective == "lsd":
        _number(params, "beta", high=1.0)
        _number(params, "temperature", low_open=True)
    elif objective == "ntd":
        _number(params, "beta")
        _number(params, "tau", low_open=True)
    elif objective == "gkd":
        _number(params, "gamma")
        _number(params, "tau", low_open=True)
    elif objective == "ssd":
        _number(params, "lam")
        lookup("strategy.psi", str(params.get("psi")), dict.fromkeys(("sqrt", "identity")))
        lookup("strategy.distill_loss", str(params.get("distill_loss")),
               dict.fromkeys(("selective", "mse", "kl")))
    elif objective == "cad":
        low = _number(params, "gamma_min", high=1.0)
        if _number(params, "gamma_max", high=1.0) < low:
            raise ConfigError(f"strategy.gamma_max ({params.gamma_max}) must be >= "
                              f"strategy.gamma_min ({low})")
        _number(params, "temperature", low_open=True)
        lookup("strategy.alpha_source", str(params.get("alpha_source")),
               dict.fromkeys(("local", "aux")))


def _fedprox(params, cfg, model):
    return {"proximal_mu": _number(params, "mu")}, {}


def _fedavgm(params, cfg, model):
    return {"server_learning_rate": _number(params, "server_lr"),
            "server_momentum": _number(params, "server_momentum", high=1.0, high_open=True)}, {}


def _fednova(params, cfg, model):
    keys = frozenset(n for n, _ in model.named_parameters()) if model is not None else frozenset()
    return {}, {"momentum": float(cfg.momentum), "param_keys": keys}


def _fedcsd(params, cfg, model):
    if not isinstance(params.get("tma"), bool):
        raise ConfigError(f"strategy.tma must be true or false, got {params.get('tma')!r}")
    alpha = _number(params, "alpha", high=1.0, high_open=True) if params.tma else 0.0
    lookup("strategy.prototypes", str(params.get("prototypes")),
           dict.fromkeys(("exchange", "previous")))
    classes = model.head.out_features if model is not None else 0
    return {}, {"alpha": alpha, "num_classes": classes,
                "one_exchange": params.prototypes == "previous"}


def _fedgkd(params, cfg, model):
    size = params.get("buffer_size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ConfigError(f"strategy.buffer_size must be a whole number >= 1, got {size!r}")
    return {}, {"buffer_size": size}


def _aux_per_class(params) -> int:
    size = params.get("aux_per_class")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ConfigError(f"strategy.aux_per_class must be a whole number >= 1, got {size!r}")
    return size


def _nothing(params, cfg, model):
    return {}, {}


# name -> (class, settings: (params, cfg, model) -> (constructor kwargs, attributes))
STRATEGIES = {
    "fedavg": (FedAvg, _nothing),
    "fedprox": (FedProx, _fedprox),
    "fedavgm": (FedAvgM, _fedavgm),
    "fednova": (FedNova, _fednova),
    "fedcsd": (FedCSD, _fedcsd),
    "fedlsd": (FedAvg, _nothing),
    "fedntd": (FedAvg, _nothing),
    "fedgkd": (FedGKD, _fedgkd),
    "fedssd": (FedSSD, _nothing),
    "fedcad": (FedCAD, _nothing),
}


def server_holdout(cfg: DictConfig) -> int:
    """Training samples per class the server keeps back from every client (0: none)."""
    cls, _ = lookup("strategy", cfg.strategy.name, STRATEGIES)
    return _aux_per_class(cfg.strategy) if cls.uses_auxiliary_set(cfg.strategy) else 0


def check_strategy(cfg: DictConfig) -> None:
    """Raise ConfigError for an unknown strategy or objective, or bad parameters."""
    build_strategy(cfg, None)


def build_strategy(cfg: DictConfig, model: nn.Module | None,
                   auxiliary: AuxiliarySet | None = None) -> DriftStrategy:
    """The strategy ``cfg.strategy`` names, configured for this experiment; ``auxiliary`` is
    the server's held-back set, for the strategies that measure the global model on it."""
    params = cfg.strategy
    cls, settings = lookup("strategy", params.name, STRATEGIES)
    objective = str(params.get("objective", "ce"))
    lookup("objective", objective, dict.fromkeys(OBJECTIVES))
    needs = set(OBJECTIVE_NEEDS.get(objective, set()))
    if objective == "cad" and params.get("alpha_source") == "aux":
        needs.add(CLASS_PHI)
    missing = needs - cls.provides
    if missing:
        raise ConfigError(f"objective '{objective}' needs {', '.join(sorted(missing))} from the "
                          f"server, which strategy '{params.name}' does not send")
    _objective_params(params, objective)
    kwargs, attributes = settings(params, cfg, model)
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
    strategy.round_timeout = float(cfg.round_timeout)
    for key, value in attributes.items():
        setattr(strategy, key, value)
    if cls.uses_auxiliary_set(params):
        server_holdout(cfg)  # checks aux_per_class
        strategy.auxiliary = auxiliary
    return strategy
