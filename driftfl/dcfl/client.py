"""DCFL on a client: condense the local data when the server asks, and train in two stages,
E_c epochs on the local data (the experiment's local_epochs, lr, batch_size), then E_s epochs
on the condensed images the server sent (finetune_epochs, finetune_lr, finetune_batch_size),
with DSA augmentation on both when ``dsa`` is on. Both stages run the one training loop with
the method's own objective (FedProx's proximal term keeps its anchor at the global model).
"""

from __future__ import annotations

import functools
import json
import secrets
import time
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message

from driftfl.common import leakage
from driftfl.common.errors import ConfigError
from driftfl.common.augment import SiameseAugment, parse_transforms
from driftfl.dcfl.settings import (CondensationSettings, PrivacyPlan, condensation_settings,
                                   privacy_plan, read_condensed)
from driftfl.common.models import build_model
from driftfl.common.protocol import (CONDENSE, CONDENSE_EPSILON, CONDENSE_SECONDS, CONDENSED,
                                     CONDENSED_COPIES, CONDENSED_SIMILARITY, CONFIG)
from driftfl.common.training import TrainSettings, TrainStats, train_locally

from driftfl.dcfl.condense import (CondenseConfig, condense, condense_config, noise_clip,
                                   progress_line)
from driftfl.client import node
from driftfl.client.job import ClientJob
from driftfl.client.state import keep, recall

RELEASED_SET = "dcfl.released-set"  # DP-DM: the set this node released (context.state)


def is_dcfl(msg: Message) -> bool:
    return CONDENSE in msg.content[CONFIG]


def received_images(msg: Message, job: ClientJob) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The condensed images a train message carries, checked (None when it carries none)."""
    if CONDENSED not in msg.content.array_records:
        return None
    checked = read_condensed(msg.content.array_records[CONDENSED], tuple(job.meta.shape),
                             job.num_classes)
    if isinstance(checked, str):
        raise ValueError(f"the server's {checked}")
    images, labels = checked
    return torch.from_numpy(images.copy()), torch.from_numpy(labels.copy())


@functools.lru_cache(maxsize=16)
def default_clip(model: str, shape: tuple[int, ...], num_classes: int) -> float:
    """DP-DM's clip when condense_dp_clip is null (``model``: the model section as JSON):
    condense.noise_clip, from public draws, so every client of the experiment gets it."""
    spec = json.loads(model)
    return noise_clip(lambda: build_model(spec, shape, num_classes), shape)


def to_record(images: torch.Tensor, labels: torch.Tensor) -> ArrayRecord:
    return ArrayRecord({"images": Array(images.detach().cpu().numpy().astype(np.float32)),
                        "labels": Array(labels.detach().cpu().numpy().astype(np.int64))})


@dataclass
class DCFLClient:
    settings: CondensationSettings
    job: ClientJob

    @classmethod
    def of(cls, job: ClientJob) -> DCFLClient:
        return cls(condensation_settings(job.experiment.strategy.model_dump()), job)

    @property
    def augment(self) -> SiameseAugment | None:
        s = self.settings
        return SiameseAugment(parse_transforms(s.dsa_transforms)) if s.dsa else None

    def config(self) -> CondenseConfig:
        return condense_config(self.settings)

    def privacy(self, y: torch.Tensor) -> PrivacyPlan | None:
        """DP-DM's plan for this node's class counts (None without condense_dp), its clip the
        noise-derived default unless condense_dp_clip is set."""
        s, job = self.settings, self.job
        if not s.condense_dp:
            return None
        clip = None if s.condense_dp_clip is not None else default_clip(
            job.experiment.model.model_dump_json(), tuple(job.meta.shape), job.num_classes)
        counts = torch.bincount(y.cpu(), minlength=job.num_classes).tolist()
        return privacy_plan(s, counts, default_clip=clip)

    def condense(self, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator
                 ) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
        """This node's condensed set and what it discloses (the reply's metrics), with a
        progress line every ``log_every`` iterations and, before and after, what it ships.

        Under condense_dp ``generator`` (seeded by the experiment seed, round and partition,
        which the server knows) is ignored: every draw comes from a generator seeded from the
        OS, so that no one can regenerate the noise; and the reply carries only the epsilon
        (a function of public counts and settings), not the time or the similarity to this
        node's images, which only this node prints. Without DP the seeded generator is used
        and the metrics are the seconds, the similarity figures and nothing else."""
        s, job = self.settings, self.job
        client = job.data.partition_id

        def progress(iteration: int, loss: float, seconds: float) -> None:
            print(progress_line(client, iteration, s.condense_iterations, loss, seconds),
                  flush=True)

        if s.condensation == "real" and not node.in_simulation():
            raise ConfigError("the server asks for condensation=real, which ships this node's "
                              "own images (a simulation-only research ablation): refused")
        started = time.perf_counter()
        privacy = self.privacy(y)
        if privacy is not None and (kept := recall(job.context, RELEASED_SET, x.device)):
            # a round asked again (re-run after a crash): what was released once is sent
            # again, post-processing; condensing anew would spend epsilon a second time
            print(f"condense: client {client} sends the set it released before "
                  f"({privacy.line()})", flush=True)
            return kept["images"], kept["labels"].long(), {CONDENSE_EPSILON: privacy.epsilon}
        if privacy is not None:
            generator = torch.Generator().manual_seed(secrets.randbits(63))
        how = ("random real images of its own (condensation=real: NOT private)"
               if s.condensation == "real" else f"{s.condensation} from {s.condense_init}")
        print(f"condense: client {client} ships {s.ipc} images per held class, {how}"
              + (f", {privacy.line()}" if privacy else ", no differential privacy"), flush=True)
        augment = (SiameseAugment(parse_transforms(s.dsa_transforms))
                   if s.condensation != "dc" else None)
        images, labels = condense(
            x, y, job.num_classes, self.config(),
            make_network=lambda: build_model(job.experiment.model, job.meta.shape,
                                             job.num_classes).to(x.device),
            augment=augment, generator=generator, progress=progress, privacy=privacy)
        seconds = time.perf_counter() - started
        found = self.similarity(images, x)
        if not node.in_simulation():  # `driftfl run` audits a simulation's sets after it
            print(f"condense: client {client}: {found.line()}", flush=True)
        if privacy is not None:
            keep(job.context, RELEASED_SET, {"images": images, "labels": labels})
            return images, labels, {CONDENSE_EPSILON: privacy.epsilon}
        return images, labels, {CONDENSE_SECONDS: seconds, CONDENSED_COPIES: found.share,
                                CONDENSED_SIMILARITY: found.median}

    def similarity(self, images: torch.Tensor, x: torch.Tensor) -> leakage.Leakage:
        """How close the set is to this node's images, on pixels (what `driftfl audit` reads)."""
        meta = self.job.meta
        return leakage.measure(leakage.to_pixels(images.cpu().numpy(), meta.mean, meta.std),
                               leakage.to_pixels(x.cpu().numpy(), meta.mean, meta.std))

    def train(self, model, x, y, objective, generator: torch.Generator,
              received: tuple[torch.Tensor, torch.Tensor] | None,
              local: TrainSettings | None = None) -> TrainStats:
        """E_c epochs on the local data (``local``: the server's assignment), then E_s on the
        received images (or, with condensed_use=mix, one stage on both); returns the combined
        steps and mean loss."""
        exp, s = self.job.experiment, self.settings
        local = local or TrainSettings.local_stage(exp)
        if received is not None:
            received = (received[0].to(x.device), received[1].to(x.device))
        if received is not None and s.condensed_use == "mix":
            first = train_locally(model, torch.cat([x, received[0]]), torch.cat([y, received[1]]),
                                  local, objective, generator, augment=self.augment)
            return TrainStats(first.steps, first.mean_loss, len(y))
        if received is None or not s.finetune_epochs or not len(received[1]):
            return train_locally(model, x, y, local, objective, generator, augment=self.augment)

        def finetune(prepare: bool) -> TrainStats:
            frozen = [p for name, p in model.named_parameters()
                      if s.finetune_layers == "head" and not name.startswith("head.")
                      and p.requires_grad]
            for p in frozen:
                p.requires_grad_(False)
            try:
                return train_locally(model, *received, TrainSettings.finetune_stage(s, exp),
                                     objective, generator, augment=self.augment,
                                     prepare=prepare)
            finally:
                for p in frozen:
                    p.requires_grad_(True)

        if s.finetune_order == "before":
            second = finetune(prepare=True)
            first = train_locally(model, x, y, local, objective, generator,
                                  augment=self.augment, prepare=False)
        else:
            first = train_locally(model, x, y, local, objective, generator, augment=self.augment)
            second = finetune(prepare=False)
        seen = (first.steps, second.steps)
        mean = (first.mean_loss * seen[0] + second.mean_loss * seen[1]) / max(sum(seen), 1)
        return TrainStats(sum(seen), mean, len(y))
