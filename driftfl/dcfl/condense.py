"""Dataset condensation on a client: learn a few synthetic images per class that stand in for
the client's real data.

Three methods of Zhao & Bilen, each moving the synthetic pixels with SGD (momentum 0.5, the
authors') or Adam from Gaussian noise (``init="noise"``, the default: what leaves the client
never starts as one of its images) or from random real images (``init="real"``, the authors'
default, which at a few hundred iterations ships near-copies of them), each outer iteration
under a freshly initialised network:

- ``dm``, distribution matching (WACV 2023): the mean embedding (``model.features``) of the
  synthetic images of each class should equal that of a batch of real images of that class;
  the network stays frozen and untrained, so an iteration costs one forward/backward pass:
  every class's real batch gathered into one batch, each class's DSA transform applied to its
  slice, embedded in one pass without autograd; the network re-initialised in place
  (FreshNetworks), convolutional ones channels-last.
- ``dc``, gradient matching (ICLR 2021): the network's cross-entropy gradients on synthetic and
  real batches of a class should point the same way (layer-wise cosine distance); between
  matching steps the network is trained on the synthetic set.
- ``dsa``: ``dc`` with Differentiable Siamese Augmentation (ICML 2021) applied with the same
  random transform to the real and the synthetic batch (DM uses it too when ``augment`` is given).

DP-DM (``privacy``, DM only): each iteration draws every class's real batch by Poisson sampling
at the plan's rate q_c, clips each real embedding to norm C and adds N(0, sigma_c^2 C^2) to the
class's sum, divided by the expected batch size q_c n_c. Only that noised mean touches the
synthetic images, so each iteration is one subsampled Gaussian mechanism per class; a sample is in
one class only, so the classes compose in parallel (condensation.PrivacyPlan accounts for it).
The networks run in eval mode under DP, so that an embedding is a function of its own image only
(a fresh BatchNorm then normalises by its running statistics, 0 and 1, not by the batch's): the
clip bounds one image's part, whatever the rest of the batch is.

The authors' paper-grade settings are DM: 20,000 SGD iterations, lr 1.0, 256 real images per
class; DC/DSA: 1,000 iterations, lr 0.1, outer/inner loops 10/50 at ipc 10. DCFL's default
(dcfl/settings.py) was chosen by measurement: 1,000 Adam iterations at lr 0.1 of 64 real images
per class (docs/algorithms.md, DCFL).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from driftfl.common.augment import SiameseAugment
from driftfl.dcfl.settings import CondensationSettings, PrivacyPlan
from driftfl.common.errors import ConfigError
from driftfl.common.models import DriftModel

# real: no condensation, ipc random real images per class (the research ablation that bounds
# what condensed images could do; DCFLClient refuses it outside simulation)
METHODS = ("dm", "dc", "dsa", "real")
INITS = ("noise", "real")
OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class CondenseConfig:
    # dm: distribution matching; dc: gradient matching; dsa: gradient matching with DSA
    method: Literal["dm", "dc", "dsa", "real"] = "dm"
    init: Literal["noise", "real"] = "noise"  # N(0, 1) in normalised space, or real images
    ipc: int = 10                 # synthetic images per condensed class
    # a class with fewer real images than this is not condensed: matching the mean of a few
    # images drives the synthetic ones onto them (measured: 1 image, 90-100 % near-copies)
    min_class: int = 1
    iterations: int = 200         # outer iterations (each with a freshly initialised network)
    lr: float = 1.0               # lr on the synthetic pixels
    optimizer: Literal["sgd", "adam"] = "sgd"  # sgd: momentum 0.5, as the authors; or adam
    real_per_class: int = 256     # real images per class per iteration
    outer_loop: int = 10          # dc/dsa only: matching steps per iteration
    inner_loop: int = 50          # dc/dsa only: network training steps on the synthetic set
                                  # between matching steps
    net_lr: float = 0.01          # dc/dsa only: that network's SGD lr
    log_every: int = 50           # a progress line every this many iterations (and the last)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"unknown condensation method '{self.method}'; "
                              f"valid: {', '.join(METHODS)}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"unknown condensation optimizer '{self.optimizer}'; "
                              f"valid: {', '.join(OPTIMIZERS)}")
        if self.init not in INITS:
            raise ConfigError(f"unknown condensation init '{self.init}'; valid: {', '.join(INITS)}")
        for name in ("ipc", "iterations", "real_per_class", "outer_loop", "log_every",
                     "min_class"):
            if getattr(self, name) < 1:
                raise ConfigError(f"condensation {name} must be at least 1")
        if self.inner_loop < 0:
            raise ConfigError("condensation inner_loop must not be negative")


def condense_config(s: CondensationSettings) -> CondenseConfig:
    """How a DCFL client with these settings condenses (a progress line every quarter)."""
    return CondenseConfig(method=s.condensation, init=s.condense_init, ipc=s.ipc,
                          iterations=s.condense_iterations, lr=s.condense_lr,
                          optimizer=s.condense_optimizer, real_per_class=s.condense_batch,
                          min_class=s.min_class,
                          outer_loop=s.dc_outer_loop, inner_loop=s.dc_inner_loop,
                          net_lr=s.dc_net_lr, log_every=max(1, s.condense_iterations // 4))


def progress_line(client: int, iteration: int, total: int, loss: float, seconds: float) -> str:
    return (f"condense: client {client} iteration {iteration}/{total}, "
            f"matching loss {loss:.4g}, {seconds:.1f} s")


def _seed(generator: torch.Generator) -> int:
    return int(torch.randint(2**62, (1,), generator=generator))


def _fresh_network(make_network: Callable[[], DriftModel], generator: torch.Generator,
                   device: torch.device, per_example: bool = False) -> DriftModel:
    """A new network initialised from ``generator``; the global (CPU) RNG is left as it was.
    ``per_example``: in eval mode (DP-DM), else in train mode, as the authors run it."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(_seed(generator))
        net = make_network()
    if any(isinstance(m, torch.nn.Conv2d) for m in net.modules()):
        # channels-last convolutions: measured 1.4x faster on LeNet-5's and the CNN's pass
        net = net.to(memory_format=torch.channels_last)
    return net.to(device).train(not per_example)


def _reset(net: DriftModel, seed: int) -> DriftModel:
    """Every layer's own ``reset_parameters``, in module order, from ``seed``."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.default_generator.manual_seed(seed)
        for module in net.modules():
            if callable(getattr(module, "reset_parameters", None)):
                module.reset_parameters()
    return net


class FreshNetworks:
    """A freshly initialised network for every iteration, each from one draw of ``generator``.

    DM needs a new random network per iteration, not a new object: where re-initialising one
    network in place gives exactly the weights that building one from the same draw gives, the
    same network is re-initialised, so no network is built or allocated per iteration. That is
    checked once, on public draws: a network whose every parameter and buffer was overwritten
    with garbage, then reset from a seed, must equal one built from that seed. A network it
    does not hold for (a custom initialisation, a layer without reset_parameters, one made on
    a GPU's generator) is built anew each time, as before."""

    PROBE_SEED = 1  # the check's draws: public, and none from ``generator``

    def __init__(self, make_network: Callable[[], DriftModel], generator: torch.Generator,
                 device: torch.device, per_example: bool = False):
        self.make_network, self.generator = make_network, generator
        self.device, self.per_example = device, per_example
        self.net: DriftModel | None = None  # the network reset in place, once checked
        self.checked = False

    def __call__(self) -> DriftModel:
        if self.net is not None:
            return _reset(self.net, _seed(self.generator))
        net = _fresh_network(self.make_network, self.generator, self.device, self.per_example)
        if not self.checked:
            self.checked = True
            built = _fresh_network(self.make_network, self.probe(), self.device,
                                   self.per_example)
            if _same_state(_reset(_garbled(copy.deepcopy(net)), _seed(self.probe())), built):
                self.net = net
        return net

    def probe(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.PROBE_SEED)


def _garbled(net: torch.nn.Module) -> torch.nn.Module:
    """``net`` with every parameter and buffer overwritten (NaN, or -1 for integers)."""
    with torch.no_grad():
        for tensor in (*net.parameters(), *net.buffers()):
            tensor.fill_(float("nan") if tensor.is_floating_point() else -1)
    return net


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    one, two = a.state_dict(), b.state_dict()
    return one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)


def check_per_example(net: DriftModel, shape: Sequence[int]) -> None:
    """ConfigError unless changing one image of a batch leaves the others' embeddings as they
    were: what DP-DM's clip needs of the model (a user model may couple images in eval mode)."""
    probe = torch.randn((3, *shape), generator=torch.Generator().manual_seed(0))
    changed = probe.clone()
    changed[0] = 10 * torch.randn(shape, generator=torch.Generator().manual_seed(1))
    device = next(net.parameters()).device
    with torch.no_grad():
        before, after = (net.features(batch.to(device))[1:] for batch in (probe, changed))
    if not torch.allclose(before, after, rtol=1e-4, atol=1e-5):
        raise ConfigError("condense_dp=true needs a model whose features of one image do not "
                          "depend on the other images of the batch (in eval mode); this "
                          "model's do")


# the default clip's public draws: CLIP_NETWORKS fresh networks, CLIP_IMAGES noise images each
CLIP_SEED, CLIP_NETWORKS, CLIP_IMAGES = 0, 4, 64


def public_networks(make_network: Callable[[], DriftModel], shape: Sequence[int]
                    ) -> Iterator[tuple[DriftModel, Tensor]]:
    """The default clip's networks (eval mode, on the CPU), each with its N(0, 1) images, all
    from the public seed CLIP_SEED."""
    generator = torch.Generator().manual_seed(CLIP_SEED)
    for _ in range(CLIP_NETWORKS):
        net = _fresh_network(make_network, generator, torch.device("cpu"), per_example=True)
        yield net, torch.randn((CLIP_IMAGES, *shape), generator=generator)


def noise_clip(make_network: Callable[[], DriftModel], shape: Sequence[int]) -> float:
    """DP-DM's default clip: the median embedding norm of N(0, 1) images (where the synthetic
    set starts) under public_networks: a function of the architecture and the image shape
    only, the same on every client."""
    norms = []
    for net, images in public_networks(make_network, shape):
        with torch.no_grad():
            norms.append(net.features(images).flatten(1).norm(dim=1))
    return float(torch.cat(norms).median())


def _sample(pools: Sequence[Tensor], n: int, generator: torch.Generator) -> list[Tensor]:
    """Up to n indices drawn without replacement from each pool (all of a smaller pool)."""
    return [pool[torch.randperm(len(pool), generator=generator)[:n]] for pool in pools]


def _distance(grad_syn: Sequence[Tensor], grad_real: Sequence[Tensor]) -> Tensor:
    """The authors' layer-wise distance ("ours"): per parameter tensor, the sum over output rows
    of 1 - cosine similarity. One-dimensional tensors (biases) count zero, as in their code."""
    total = grad_syn[0].new_zeros(())
    for gs, gr in zip(grad_syn, grad_real):
        if gs.dim() == 1:
            continue
        gs, gr = gs.reshape(gs.shape[0], -1), gr.reshape(gr.shape[0], -1)
        cosine = (gs * gr).sum(-1) / (gs.norm(dim=-1) * gr.norm(dim=-1) + 1e-6)
        total = total + (1 - cosine).sum()
    return total


def _initial_images(x: Tensor, pools: list[Tensor], config: CondenseConfig,
                    generator: torch.Generator) -> Tensor:
    """``ipc`` starting images per held class: N(0, 1) noise (normalised space, where the
    images have zero mean and unit variance per channel), or random real images of the class
    (repeats only where a class has fewer than ipc)."""
    ipc = config.ipc
    if config.init == "noise":
        return torch.randn((len(pools) * ipc, *x.shape[1:]), generator=generator).to(x.device)
    init = [pool[torch.randperm(len(pool), generator=generator)[:ipc]] if len(pool) >= ipc
            else pool[torch.randint(len(pool), (ipc,), generator=generator)] for pool in pools]
    first = torch.cat(init) if init else torch.zeros(0, dtype=torch.long)
    return x[first.to(x.device)].clone()


class _Condenser:
    """The state one ``condense`` call shares between its steps."""

    def __init__(self, x: Tensor, pools: list[Tensor], classes: list[int], syn: Tensor,
                 config: CondenseConfig, augment: SiameseAugment | None,
                 generator: torch.Generator, privacy: PrivacyPlan | None = None):
        self.x, self.pools, self.classes, self.syn = x, pools, classes, syn
        self.config, self.augment, self.generator = config, augment, generator
        self.privacy = privacy
        self.syn_y = torch.tensor(classes, dtype=torch.long, device=x.device).repeat_interleave(
            config.ipc)

    def real_batches(self) -> list[Tensor]:
        """Indices of each class's real batch: ``real_per_class`` drawn without replacement, or
        under DP a Poisson sample at the plan's rate (what its accounting assumes)."""
        if self.privacy is None:
            return _sample(self.pools, self.config.real_per_class, self.generator)
        return [pool[torch.rand(len(pool), generator=self.generator)
                     < self.privacy.rates[c]] for c, pool in zip(self.classes, self.pools)]

    def pairs(self) -> list[tuple[Tensor, Tensor]]:
        """(real batch, synthetic images) per class, augmented with one shared seed each."""
        ipc, out = self.config.ipc, []
        for k, idx in enumerate(self.real_batches()):
            real, syn = self.x[idx.to(self.x.device)], self.syn[k * ipc:(k + 1) * ipc]
            if self.augment is not None:
                seed = _seed(self.generator)
                real, syn = self.augment(real, seed), self.augment(syn, seed)
            out.append((real, syn))
        return out

    def batch(self) -> tuple[Tensor, Tensor, list[int]]:
        """Every class's real batch and synthetic images, each as one batch in class order
        (the draws of ``pairs``: the real batches, then one augmentation seed per class shared
        by its real and synthetic images), and the real batches' sizes."""
        batches = self.real_batches()
        sizes = [len(idx) for idx in batches]
        real = self.x.index_select(0, torch.cat(batches).to(self.x.device))  # one copy
        syn = self.syn
        if self.augment is not None:
            seeds = [_seed(self.generator) for _ in batches]
            real = self.augment.grouped(real, sizes, seeds)
            syn = self.augment.grouped(syn, [self.config.ipc] * len(seeds), seeds)
        return real, syn, sizes

    def dm_loss(self, net: DriftModel) -> Tensor:
        """Sum over classes of the squared distance between mean real and synthetic embeddings.
        All classes go through the network as one batch, the real images without autograd (a
        BatchNorm in train mode mixes them; under DP the network is in eval mode: each
        embedding is its image's alone)."""
        real, syn, sizes = self.batch()
        with torch.no_grad():
            parts = net.features(real).flatten(1).split(sizes)
        if self.privacy is None:
            real_means = torch.stack([part.mean(0) for part in parts])
        else:
            real_means = torch.stack([self.private_mean(c, part)
                                      for c, part in zip(self.classes, parts)])
        syn_means = net.features(syn).flatten(1).view(len(sizes), self.config.ipc, -1).mean(1)
        return ((real_means - syn_means) ** 2).sum()

    def private_mean(self, label: int, embeddings: Tensor) -> Tensor:
        """(sum of the embeddings each clipped to norm C + N(0, sigma^2 C^2)) / (q n): a sample
        moves it by at most C / (q n), whatever the sample is."""
        plan, pool = self.privacy, self.pools[self.classes.index(label)]
        norms = embeddings.norm(dim=1, keepdim=True)
        clipped = embeddings * torch.clamp(plan.clip / (norms + 1e-12), max=1.0)
        noise = torch.randn(embeddings.shape[1], generator=self.generator).to(embeddings.device)
        total = clipped.sum(0) + noise * plan.noise[label] * plan.clip
        return total / (plan.rates[label] * len(pool))

    def dc_loss(self, net: DriftModel) -> Tensor:
        """Sum over classes of the distance between CE gradients on real and synthetic batches."""
        params = [p for p in net.parameters() if p.requires_grad]
        loss = self.syn.new_zeros(())
        for c, (real, syn) in zip(self.classes, self.pairs()):
            label = torch.tensor(c, device=self.x.device)
            real_loss = F.cross_entropy(net(real), label.expand(len(real)))
            grad_real = [g.detach() for g in torch.autograd.grad(real_loss, params)]
            syn_loss = F.cross_entropy(net(syn), label.expand(len(syn)))
            grad_syn = torch.autograd.grad(syn_loss, params, create_graph=True)
            loss = loss + _distance(grad_syn, grad_real)
        return loss

    def train_network(self, net: DriftModel, optimizer: torch.optim.Optimizer) -> None:
        """``inner_loop`` full-batch SGD steps on the (detached) synthetic set; with DSA each
        step augments every image independently, as the authors' inner loop does."""
        images = self.syn.detach()
        for _ in range(self.config.inner_loop):
            batch = images
            if self.config.method == "dsa":
                batch = self.augment(images, _seed(self.generator), per_sample=True)
            loss = F.cross_entropy(net(batch), self.syn_y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()


def condense(x: Tensor, y: Tensor, num_classes: int, config: CondenseConfig, *,
             make_network: Callable[[], DriftModel], augment: SiameseAugment | None,
             generator: torch.Generator,
             progress: Callable[[int, float, float], None] | None = None,
             privacy: PrivacyPlan | None = None) -> tuple[Tensor, Tensor]:
    """Condense (x, y) into ``config.ipc`` synthetic images per class holding at least
    ``config.min_class`` images (ascending classes; none for a client holding no such class).

    All randomness (initial images, real batches, augmentation seeds, network initialisation,
    DP noise) comes from ``generator``, so equal inputs and seeds give identical results (under
    DP the caller seeds it from the OS: DCFLClient.condense).
    ``progress`` gets (iteration, matching loss per class, seconds so far); for dc/dsa the loss
    is also averaged over the outer steps, as the authors print it. ``privacy``: DP-DM's plan
    (clip, per-class rates and noise multipliers), for ``dm`` from noise only.
    """
    if config.method == "dsa" and augment is None:
        raise ValueError("condensation method 'dsa' needs an augment (SiameseAugment)")
    if privacy is not None and (config.method != "dm" or config.init != "noise"):
        raise ConfigError("differentially private condensation needs condensation=dm and "
                          "condense_init=noise")
    if privacy is not None and privacy.clip is None:
        raise ValueError("DP-DM's plan has no clip (privacy_plan's default_clip)")
    start = time.perf_counter()
    x = x.float()
    labels = y.to(x.device).long()
    counts = torch.bincount(labels.cpu(), minlength=num_classes)
    classes = [c for c in range(num_classes) if int(counts[c]) >= max(1, config.min_class)]
    pools = [torch.nonzero(labels == c).flatten().cpu() for c in classes]
    if config.method == "real":  # the ablation: random real images, nothing learned
        real = _initial_images(x, pools, replace(config, init="real"), generator)
        labels_out = torch.tensor(classes, dtype=torch.long, device=x.device)
        return real, labels_out.repeat_interleave(config.ipc)
    syn = _initial_images(x, pools, config, generator).requires_grad_(True)
    state = _Condenser(x, pools, classes, syn, config, augment if config.method != "dc" else None,
                       generator, privacy)
    if not classes:
        return syn.detach(), state.syn_y
    optimizer = (torch.optim.SGD([syn], lr=config.lr, momentum=0.5) if config.optimizer == "sgd"
                 else torch.optim.Adam([syn], lr=config.lr))

    def step(loss: Tensor) -> float:
        optimizer.zero_grad(set_to_none=True)
        loss.backward(inputs=[syn])  # only the pixels: the network's grads are not needed
        optimizer.step()
        return float(loss.detach())

    networks = FreshNetworks(make_network, generator, x.device, per_example=privacy is not None)
    for iteration in range(1, config.iterations + 1):
        net = networks()
        if privacy is not None and iteration == 1:
            check_per_example(net, x.shape[1:])
        if config.method == "dm":
            net.requires_grad_(False)
            loss = step(state.dm_loss(net)) / len(classes)
        else:
            net_opt = torch.optim.SGD(net.parameters(), lr=config.net_lr)
            total = 0.0
            for outer in range(config.outer_loop):
                total += step(state.dc_loss(net))
                if outer < config.outer_loop - 1:
                    state.train_network(net, net_opt)
            loss = total / (len(classes) * config.outer_loop)
        if progress is not None and (iteration % config.log_every == 0
                                     or iteration == config.iterations):
            progress(iteration, loss, time.perf_counter() - start)
    return syn.detach(), state.syn_y

