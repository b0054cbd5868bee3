"""The release part of a round (base.py says what each release does and declares)."""

from __future__ import annotations

from driftfl.strategies.parts.release.base import (Release, Released, RoundFacts, SecureSum,
                                                   read_terms)
from driftfl.strategies.parts.release.central import CentralRelease
from driftfl.strategies.parts.release.distributed import DistributedRelease

__all__ = ["CentralRelease", "DistributedRelease", "Release", "Released", "RoundFacts",
           "SecureSum", "build_release", "read_terms"]


def build_release(cfg, payload: str = "") -> Release:
    """The release of a checked experiment; ``payload``: the method's summed payload in words
    ("": it sends none)."""
    privacy, secure = cfg.privacy, cfg.secagg.enabled
    sizes = {"num_clients": cfg.num_clients, "per_round": cfg.clients_per_round,
             "payload": payload}
    if privacy.name == "central":
        return CentralRelease(privacy, rate=cfg.fraction, **sizes)
    if privacy.name == "distributed":
        return DistributedRelease(privacy, secure=secure, **sizes)
    return Release(secure=secure)
