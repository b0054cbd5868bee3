"""The least privacy a node accepts: its operator's floor, never the server's choice.

Every message carries the experiment, privacy settings included, and the node builds its reply
from it. Without a floor a deviating server could ask for ``privacy=none`` (raw updates), a
noise multiplier of 0, a clip of 1e9, or a cohort so large that each noise share is tiny
(under ``distributed`` a client adds sigma C / sqrt(m_min), m_min computed from the
experiment's num_clients, fraction and min_survivors). A node's operator pins the floor in its
``--node-config`` (deployment); in simulation, where every node is the experimenter's, per
partition in ``simulation.node_floors``. A message asking for less is refused on the node, in
one line, and the server counts the node as a dropout (as Flower's ``LocalDpMod``, the floor
lives on the client).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from .settings import Settings

# what each mode shows the server of one update: everything (none), everything to a server
# trusted to noise the sum (central), only the client's own clipped and noised share
# (distributed)
MODES = ("none", "central", "distributed")


class PrivacyFloor(Settings):
    """A node's floor; the keys are --node-config's (``min-privacy=\"distributed\"``)."""

    # by its keys as written, or by field name (as the experiment's JSON carries it)
    model_config = ConfigDict(**Settings.model_config, populate_by_name=True)

    min_privacy: Literal["none", "central", "distributed"] = Field(
        "none", alias="min-privacy", description=(
            "the weakest privacy= the node trains under: distributed (it clips and noises its "
            "own update), central (it trusts the server to), none (anything)"))
    min_noise_multiplier: float = Field(0.0, ge=0, alias="min-noise-multiplier", description=(
        "the least privacy.noise_multiplier it accepts (0: any)"))
    max_clip: float | None = Field(None, gt=0, alias="max-clip", description=(
        "the largest privacy.clip C it accepts (null: any)"))
    max_cohort: int | None = Field(None, ge=1, alias="max-cohort", description=(
        "distributed: the most clients whose noise shares it trusts to add up, m_min; a "
        "larger m_min makes each share, sigma C / sqrt(m_min), smaller (null: any)"))
    require_secagg: bool = Field(False, alias="require-secagg", description=(
        "send a training update only inside SecAgg+, so that the server sees the sum alone"))
    # SecAgg+'s own parameters are the server's: a node checks them in every SecAgg+ round
    # (client/secure.py), whatever else its floor says
    min_secagg_clients: int = Field(2, ge=2, alias="min-secagg-clients", description=(
        "SecAgg+: the fewest clients a round's key set (this node's neighbourhood) and its "
        "sample may hold; with fewer, the server could unmask this node's own vector"))
    min_secagg_threshold: int = Field(2, ge=2, alias="min-secagg-threshold", description=(
        "SecAgg+: the fewest shares that rebuild a secret (and always more than half of the "
        "shares, so that no server gets both a node's mask seed and its key)"))


def floor_refusal(floor: PrivacyFloor, experiment, secure: bool | None = None) -> str | None:
    """Why ``experiment`` asks for less than ``floor`` (None: it does not); ``secure``: whether
    the message is part of a SecAgg+ round (None: not a training message)."""
    privacy = experiment.privacy
    if MODES.index(privacy.name) < MODES.index(floor.min_privacy):
        return (f"the server asks for privacy={privacy.name}; this node trains only under "
                f"privacy={floor.min_privacy} or stronger (min-privacy)")
    sigma = privacy.noise_multiplier if privacy.enabled else 0.0
    if sigma < floor.min_noise_multiplier:
        return (f"the server asks for noise multiplier {sigma:g}; this node accepts "
                f"{floor.min_noise_multiplier:g} at least (min-noise-multiplier)")
    if floor.max_clip is not None and not (privacy.enabled and privacy.clip <= floor.max_clip):
        clip = f"clip {privacy.clip:g}" if privacy.enabled else "no clip"
        return (f"the server asks for {clip}; this node accepts a clip of "
                f"{floor.max_clip:g} at most (max-clip)")
    if floor.max_cohort is not None and privacy.name == "distributed":
        shares = privacy.noise_shares(experiment.clients_per_round)
        if shares > floor.max_cohort:
            return (f"the server asks this node to add 1/{shares} of the noise (m_min = "
                    f"{shares}: num_clients={experiment.num_clients}, fraction="
                    f"{experiment.fraction:g}, min_survivors={privacy.min_survivors:g}); this "
                    f"node trusts a cohort of {floor.max_cohort} at most (max-cohort)")
    if floor.require_secagg and secure is False:
        return ("the server asks for this node's update outside SecAgg+; this node sends it "
                "only inside SecAgg+ (require-secagg)")
    return None
