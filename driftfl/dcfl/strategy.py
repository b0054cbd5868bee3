"""DCFL (data-condensation aided FL): clients condense their data; the server keeps the
condensed sets, selects clients by the CKA of their classifiers and sends each explored client
the condensed images of the explored clients least like it, to fine-tune on.

Layered over any aggregation (mean, fednova, feddisco) and the ce or prox objective: the
selection is the ``cka`` part (``selection=uniform`` is the paper's "random" ablation), the
aggregation part sees each client weighted by n_k + ñ_k (ñ_k: the condensed images the server
sent it, a count the server knows without asking). State, all on the server: the explored
clients, their classifiers and the CKA matrix, and the condensed store.

1. Pre-training (once, before round 1): for M requests, max(C_pre * K, 1) clients at random;
   each not yet explored condenses, trains E_c epochs from w^0 and returns its condensed set
   and its classifier; then the server trains w^0 on all condensed images: w^1.
2. Each round: an unexplored client condenses and trains on its data, returning its model and
   its condensed set; an explored client gets its complementary group's condensed images, the
   share r the global model gets worst (highest loss) dropped, and fine-tunes on them.
A condensed set is stored (and its client explored, its classifier put in the CKA matrix) only
when it passes condensed.py's checks: at most ipc images per class, of classes the node holds,
no image outsizing the known sets by max_peer_ratio; w^1 replaces w^0 only when it is finite and
within max_update_ratio of it (else w^0 stays, the refusal in round 1's row).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace
from logging import INFO

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.supercore import log

from driftfl.common.augment import SiameseAugment, parse_transforms
from driftfl.common.error_replies import log_refused
from driftfl.common.protocol import (
    ARRAYS,
    CONDENSE,
    CONDENSED,
    CONFIG,
    DATASET_META,
    DCFL_CONDENSE,
    METHOD,
    NUM_EXAMPLES,
    PROXIMAL_MU,
    SERVER_ROUND,
    DatasetMeta,
    load_numpy,
)
from driftfl.common.training import CrossEntropy, TrainSettings, train_locally
from driftfl.dcfl import shipped
from driftfl.dcfl.cka import (
    cka_input,
    complementary_group,
    keep_lowest_loss,
    linear_cka,
    offdiagonal,
    selection_tv,
)
from driftfl.dcfl.condensed import (
    bounded_sets,
    check_condensed,
    check_pretrain_reply,
    copied_head,
    outsized,
)
from driftfl.dcfl.settings import CondensationSettings
from driftfl.specs import methods as declared
from driftfl.strategies.base import DriftStrategy
from driftfl.strategies.parts.aggregation import ClientUpdate, to_numpy, to_record
from driftfl.strategies.parts.selection import ExploredClients


@dataclass
class RoundLog:
    """What DCFL did in a round, for its metrics row."""

    selected: list[str] = field(default_factory=list)  # client names (partition ids)
    exploited: list[str] = field(default_factory=list)
    explored: list[str] = field(default_factory=list)
    bytes_sent: int = 0  # condensed images only
    bytes_received: int = 0
    # column -> client -> the node's own figure (condense_seconds, condense_epsilon, ...)
    disclosed: dict[str, dict[str, float]] = field(default_factory=dict)
    pretrain_accuracy: float | None = None
    new_sets: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


class DCFL(DriftStrategy):
    spec = declared.DCFL
    server_columns = frozenset({"selected", "exploited", "explored_now", "explored_total",
                                "condensed_bytes_sent", "condensed_bytes_received",
                                "pretrain_accuracy", "cka_offdiag_min", "cka_offdiag_max",
                                "selection_tv", *shipped.COLUMNS.values()})
    client_figures = frozenset(shipped.COLUMNS.values())

    def __init__(self, *, model: torch.nn.Module, pretrain_fraction: float,
                 pretrain_requests: int, pretrain: TrainSettings, filter_ratio: float,
                 group_size: int | None, cka_of: str, finetune: TrainSettings, mix: bool,
                 finetune_own_set: bool,
                 augment: SiameseAugment | None,
                 ipc: int, condensing: CondensationSettings,
                 proximal_mu: float | None, seed: int, device: str, **kwargs):
        super().__init__(**kwargs)
        self.model = model  # a scratch copy: the filter's losses, the pre-training
        self.pretrain_fraction, self.pretrain_requests = pretrain_fraction, pretrain_requests
        self.pretrain_settings = pretrain
        self.filter_ratio, self.group_size = filter_ratio, group_size
        self.finetune_own_set = finetune_own_set
        self.cka_of = cka_of
        # what a client does with the images it receives: E_s epochs of fine-tuning after its
        # E_c local epochs, or (mix) one stage on its data and them together
        self.finetune, self.mix = finetune, mix
        self.exchange = mix or finetune.epochs > 0  # whether any images are sent
        self.augment, self.ipc = augment, ipc
        self.condensing = condensing  # how clients condense: what the run's first lines say
        self.proximal_mu, self.seed, self.device = proximal_mu, seed, device
        self.explored: list[int] = []  # node ids, in the order they were explored
        self.classifiers: list[np.ndarray] = []  # what the CKA compares (cka_of), same order
        self.matrix = np.zeros((0, 0))  # CKA between those classifiers
        self.store: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # node -> condensed set
        self.asked: set[int] = set()  # nodes asked to condense this round
        self.checked_sets: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # their checked sets
        self.sent_images: dict[int, int] = {}  # node -> condensed images sent this round
        self.log = RoundLog()
        self.started = False
        self.image_shape: tuple[int, ...] = ()  # from the dataset description, in round 1
        self.pretrained: dict[str, np.ndarray] | None = None  # w^1, until its row records it
        self.early: list[str] = []  # the pre-training's refusal, for round 1's report

    @classmethod
    def arguments(cls, settings, *, model, aux_set, experiment):
        return {"model": copy.deepcopy(model),
                "pretrain_fraction": settings.pretrain_fraction,
                "pretrain_requests": settings.pretrain_requests,
                "pretrain": TrainSettings(settings.pretrain_epochs, settings.finetune_batch_size,
                                          settings.pretrain_lr, experiment.momentum, 0.0),
                "filter_ratio": settings.filter_ratio, "group_size": settings.group_size,
                "finetune_own_set": settings.finetune_own_set,
                "cka_of": settings.cka_of,
                "finetune": TrainSettings.finetune_stage(settings, experiment),
                "mix": settings.condensed_use == "mix",
                "augment": (SiameseAugment(parse_transforms(settings.dsa_transforms))
                            if settings.dsa else None),
                "ipc": settings.ipc,
                "condensing": CondensationSettings.model_validate(
                    settings.model_dump(include=set(CondensationSettings.model_fields))),
                "proximal_mu": settings.mu if settings.objective == "prox" else None,
                "seed": experiment.seed, "device": experiment.device}

    # -- what the server knows of its clients --------------------------------------------
    def rekey(self, moved: dict[int, int]) -> None:
        self.explored = [moved.get(n, n) for n in self.explored]
        self.store = {moved.get(n, n): s for n, s in self.store.items()}

    def explored_clients(self) -> ExploredClients:
        return ExploredClients(list(self.explored), self.matrix)

    def explore(self, node: int, classifier: np.ndarray, images: np.ndarray,
                labels: np.ndarray, figures: dict[str, float]) -> None:
        """Keep a newly explored client's condensed set and classifier; update the matrix."""
        if node in self.store:
            return
        # the update is against the head this client was sent: w^0 or this round's model
        weight = cka_input(classifier, self.global_arrays.get("head.weight"), self.cka_of)
        row = [linear_cka(other, weight) for other in self.classifiers]  # only the new row
        self.matrix = np.block([[self.matrix, np.array(row)[:, None]],
                                [np.array(row)[None, :], np.array([[linear_cka(weight, weight)]])]])
        self.explored.append(node)
        self.classifiers.append(weight)
        self.store[node] = (images, labels)
        self.log.explored.append(self.clients.name(node))
        self.log.new_sets[self.clients.name(node)] = (images, labels)
        self.log.bytes_received += images.nbytes + labels.nbytes
        for key, value in figures.items():
            column = self.log.disclosed.setdefault(shipped.COLUMNS[key], {})
            column[f"client_{self.clients.name(node)}"] = value

    def partition_ids(self, nodes) -> list[str]:
        return [self.clients.name(n) for n in nodes]

    # -- the pre-training stage ----------------------------------------------------------
    def pretrain(self, arrays: ArrayRecord, config: ConfigRecord, grid) -> ArrayRecord:
        """M request rounds of condensation at C_pre, then w^0 trained on all condensed data."""
        if not self.pretrain_requests:
            return arrays
        query_config = ConfigRecord(dict(config))
        query_config[SERVER_ROUND] = 0
        nodes = self.available(0, grid)
        count = min(len(nodes), max(math.floor(self.pretrain_fraction * len(nodes) + 1e-9), 1))
        head = self.head_shape()
        self.global_arrays = to_numpy(arrays)  # what explore() measures the updates against
        for request in range(1, self.pretrain_requests + 1):
            rng = np.random.default_rng([self.seed, 0, request])
            asked = [nodes[i] for i in sorted(rng.choice(len(nodes), size=count, replace=False))
                     if nodes[i] not in self.store]
            messages = [Message(RecordDict({ARRAYS: arrays, CONFIG: query_config}),
                                dst_node_id=node,
                                message_type=f"{MessageType.QUERY}.{DCFL_CONDENSE}")
                        for node in asked]
            replies = self.clients.in_order(
                grid.send_and_receive(messages, timeout=self.round_timeout))
            checked = [check_pretrain_reply(r, self.image_shape, head, self.ipc,
                                            self.clients.histograms.get(r.metadata.src_node_id))
                       for r in replies]
            for k, result in enumerate(checked):
                if not isinstance(result, str) and (copied := copied_head(
                        result[0], self.global_arrays.get("head.weight"))):
                    checked[k] = copied
            sets = [k for k, c in enumerate(checked) if not isinstance(c, str)]
            for k, reason in outsized([checked[k][1] for k in sets], self.store,
                                      self.max_peer_ratio).items():
                checked[sets[k]] = reason
            sets = [k for k, c in enumerate(checked) if not isinstance(c, str)]
            for k, images in zip(sets, self.bounded([checked[k][1] for k in sets])):
                checked[k] = (checked[k][0], images, *checked[k][2:])
            refused = []
            for reply, result in zip(replies, checked):
                if isinstance(result, str):
                    refused.append((self.clients.describe(reply.metadata.src_node_id), result))
                else:
                    self.explore(reply.metadata.src_node_id, *result)
            log_refused("DCFL pre-training", refused)
            print(f"DCFL pre-training: request {request}/{self.pretrain_requests}, asked "
                  f"clients {self.partition_ids(asked)}, {len(self.explored)} explored",
                  flush=True)
        images, labels = self.condensed_of(self.explored)
        if not len(labels) or not self.pretrain_settings.epochs:
            return arrays
        model = self.scratch(to_numpy(arrays))
        x = torch.from_numpy(images).to(self.device)
        y = torch.from_numpy(labels).to(self.device)
        train_locally(model, x, y, self.pretrain_settings, CrossEntropy(),
                      torch.Generator().manual_seed(self.seed), augment=self.augment)
        print(f"DCFL pre-training: the server trained the initial model on {len(labels)} "
              f"condensed images for {self.pretrain_settings.epochs} epochs", flush=True)
        trained = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
        refused = self.guard.state_problem(trained, to_numpy(arrays))
        if refused:  # checked like an aggregate; round 1 starts from w^0
            self.guard.refuse_state(self.report, 0, "DCFL's pre-trained model", refused)
            self.early = [f"DCFL's pre-trained model: {refused}"]
            return arrays
        self.pretrained = trained
        return to_record(trained)

    def head_shape(self) -> tuple[int, int]:
        return tuple(self.model.head.weight.shape)

    # -- a round -------------------------------------------------------------------------
    def configure_train(self, server_round, arrays, config, grid):
        self.log = RoundLog()
        if not self.started:
            self.started = True
            self.announce()
            self.image_shape = tuple(self.infer_shape(config))
            arrays = self.pretrain(arrays, config, grid)
        self.global_arrays = to_numpy(arrays)
        config[SERVER_ROUND] = server_round
        config[METHOD] = self.objective
        if self.proximal_mu is not None:
            config[PROXIMAL_MU] = self.proximal_mu
        nodes = self.plan.start(server_round, self.sample(server_round, grid), self.clients.key,
                                self.clients.count, self.local_training)  # less the dropped
        self.log.selected = self.partition_ids(nodes)
        self.log.exploited = self.partition_ids(self.selection.last_exploited)
        self.asked = {n for n in nodes if n not in self.store}
        self.checked_sets = {}
        self.sent_images = {}
        size = len(nodes) - 1 if self.group_size is None else self.group_size
        messages = []
        for node in nodes:
            node_config = ConfigRecord(dict(config))
            node_config[CONDENSE] = node in self.asked
            content = {ARRAYS: arrays, CONFIG: node_config, **self.plan.record(node)}
            if node in self.store and self.exchange:
                group = complementary_group(node, self.explored, self.matrix, size)
                images, labels = self.filtered(self.condensed_of(group))
                if self.finetune_own_set:  # unfiltered, as line 13 merges it after the filter
                    images = np.concatenate([images, self.store[node][0]])
                    labels = np.concatenate([labels, self.store[node][1]])
                if len(labels):
                    content[CONDENSED] = ArrayRecord({"images": Array(images),
                                                      "labels": Array(labels)})
                    self.sent_images[node] = len(labels)
                    self.log.bytes_sent += images.nbytes + labels.nbytes
            messages += self._construct_messages(RecordDict(content), [node], MessageType.TRAIN)
        log(INFO, "configure_train: %d of the nodes train in round %d", len(nodes), server_round)
        return self.keep_sent(messages)

    def announce(self) -> None:
        """What will leave the clients, said before any of it does."""
        known = self.clients
        shipped.announce(self.condensing, [
            (known.name(node), histogram) for node, histogram
            in sorted(known.histograms.items(), key=lambda item: known.rank(item[0]))])

    def infer_shape(self, config: ConfigRecord) -> list[int]:
        return DatasetMeta.from_json(str(config[DATASET_META])).shape

    def condensed_of(self, nodes: list[int]) -> tuple[np.ndarray, np.ndarray]:
        if not nodes:
            return (np.zeros((0, *self.image_shape), np.float32), np.zeros(0, np.int64))
        return (np.concatenate([self.store[n][0] for n in nodes]),
                np.concatenate([self.store[n][1] for n in nodes]))

    def filtered(self, condensed: tuple[np.ndarray, np.ndarray]):
        """The images kept after the share r with the highest loss under the global model."""
        images, labels = condensed
        if not self.filter_ratio or not len(labels):
            return images, labels
        model = self.scratch(self.global_arrays).eval()
        with torch.no_grad():
            losses = F.cross_entropy(model(torch.from_numpy(images).to(self.device)),
                                     torch.from_numpy(labels).to(self.device), reduction="none")
        keep = keep_lowest_loss(losses.cpu().numpy(), self.filter_ratio)
        return images[keep], labels[keep]

    def scratch(self, arrays: dict[str, np.ndarray]) -> torch.nn.Module:
        load_numpy(self.model, arrays)
        return self.model.to(self.device)

    # -- what comes back -----------------------------------------------------------------
    def reject(self, update: ClientUpdate) -> str | None:
        reason = super().reject(update)
        if reason or update.node_id not in self.asked:
            return reason
        checked = check_condensed(update.message, self.image_shape, self.head_shape()[0],
                                  self.ipc, self.clients.histograms.get(update.node_id))
        if isinstance(checked, str):
            return checked
        self.checked_sets[update.node_id] = checked  # kept for accept, not read twice
        return None

    def local_steps(self, update: ClientUpdate) -> int | None:
        """E_c epochs on the local data, then E_s on the images sent (mix: E_c on both)."""
        received = self.sent_images.get(update.node_id, 0)
        local = self.plan.training(update.node_id, self.local_training)  # heterogeneity's epochs
        if local is None:
            return None
        if received and self.mix:
            return local.steps(update.num_examples + received)
        return local.steps(update.num_examples) + self.finetune.steps(received)

    def steps_rule(self, update: ClientUpdate) -> str:
        received = self.sent_images.get(update.node_id, 0)
        if received and self.mix:
            return self.plan.training(update.node_id, self.local_training).in_words(
                f"its {update.num_examples:.12g} examples and the {received} images sent")
        return super().steps_rule(update) + (
            f", then {self.finetune.in_words(f'the {received} images sent')}"
            if received and self.finetune.epochs else "")

    def screen(self, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        """The new condensed sets against the stored ones and each other (condensed.outsized),
        and a classifier that did not move (condensed.copied_head)."""
        new = [u for u in updates if u.node_id in self.asked]
        bad = outsized([self.checked_sets[u.node_id][0] for u in new], self.store,
                       self.max_peer_ratio)
        peers = set(bad)  # (the copied heads are added below: a check of the reply alone)
        for k, u in enumerate(new):
            if k not in bad and (copied := copied_head(u.arrays["head.weight"],
                                                       self.global_arrays.get("head.weight"))):
                bad[k] = copied
        for k, reason in bad.items():
            self.guard.refuse_reply(self.report, new[k].node_id, reason, by_peers=k in peers)
        dropped = {new[k].node_id for k in bad}
        kept = [u for u in new if u.node_id not in dropped]
        for u, images in zip(kept, self.bounded([self.checked_sets[u.node_id][0] for u in kept])):
            self.checked_sets[u.node_id] = (images, self.checked_sets[u.node_id][1])
        return [u for u in updates if u.node_id not in dropped]

    def bounded(self, sets: list[np.ndarray]) -> list[np.ndarray]:
        """The arriving sets' images, bounded where the aggregation bounds the clients' parts
        (trust=none: condensed.bounded_sets); as sent otherwise."""
        if not self.aggregation.bounds_updates:
            return sets
        return bounded_sets(sets, self.store, self.aggregation.clip_ratio)

    def accept(self, replies) -> list[ClientUpdate]:
        updates = super().accept(replies)
        self.report.refused_state[:0], self.early = self.early, []
        for update in updates:
            if update.node_id in self.asked:
                self.explore(update.node_id, update.arrays["head.weight"],
                             *self.checked_sets[update.node_id], shipped.figures(update.metrics))
        # weights n_k + ñ_k: ñ_k is what the server itself sent
        updates = [replace(u, metrics={**u.metrics, NUM_EXAMPLES: u.num_examples
                                       + self.sent_images.get(u.node_id, 0)}) for u in updates]
        self.last_updates = updates
        return updates

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None and server_round == 1:  # keep the pre-trained model
            arrays = to_record(self.global_arrays)
        return arrays, metrics

    # -- what the run directory keeps ----------------------------------------------------
    def server_metrics(self, accuracy_of) -> dict:
        row = {"selected": " ".join(self.log.selected),
               "exploited": " ".join(self.log.exploited),
               "explored_now": " ".join(self.log.explored),
               "explored_total": len(self.explored),
               "condensed_bytes_sent": self.log.bytes_sent,
               "condensed_bytes_received": self.log.bytes_received,
               **{column: dict(self.log.disclosed.get(column, {}))
                  for column in shipped.COLUMNS.values()}}
        if len(self.matrix) > 1:  # the matrix the next round selects by
            pairs = offdiagonal(self.matrix)
            row.update(cka_offdiag_min=float(pairs.min()), cka_offdiag_max=float(pairs.max()),
                       selection_tv=selection_tv(self.matrix))
        if self.pretrained is not None:
            row["pretrain_accuracy"] = accuracy_of(self.pretrained)
            self.pretrained = None
        return row

    def round_arrays(self) -> dict[str, np.ndarray]:
        """The CKA matrix over all surveyed clients in partition order (NaN: not explored)."""
        ranked = sorted(self.clients.node_rank, key=self.clients.rank)
        order = {node: i for i, node in enumerate(ranked)}
        full = np.full((len(order), len(order)), np.nan)
        where = [order[node] for node in self.explored]
        full[np.ix_(where, where)] = self.matrix
        return {"cka": full}

    def round_images(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The condensed sets received this round, by client, for the run directory."""
        return {f"client_{p}": s for p, s in self.log.new_sets.items()}
