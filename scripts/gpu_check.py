"""Check driftfl's GPU paths against the CPU. Each check runs the same computation from the same
start on the CPU and on ``--device`` and compares the results:

- every local objective in the registry, two rounds of one node through the training loop (the
  second reads the state the first kept: SCAFFOLD's c_k, FedDyn's g_k, MOON's previous model,
  FedCSD's teacher logits): weights, losses, diagnostics, reply records, node state;
- the models (forward pass, a short training run), central evaluation, the logit-shift probe,
  FedCSD's prototypes and masks;
- DCFL: DSA augmentation (each transform, its gradient), condensation (dm, dc, dsa), the
  client's two training stages (finetune, mix), the server's pre-training and image filter;
- the server's aux set (FedSSD's credibility matrix, FedCAD's class phi).
The other server parts (FedProto's and FedCSD's prototypes, SCAFFOLD's control variate, FedDyn's
state, FedCurv's Fisher sums, DCFL's CKA) work on NumPy arrays on the CPU whatever the device;
what they aggregate comes from the clients and is compared here in the objectives' replies.

    python scripts/gpu_check.py                 (on a machine with a CUDA GPU)
    python scripts/gpu_check.py --device cpu    (anywhere: the CPU against itself, which
                                                 checks the script)

Prints one line per check; exits 1 on any mismatch, 2 when the device is not there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict  # noqa: E402

from driftfl.dcfl.condense import CondenseConfig, condense
from driftfl.dcfl.client import DCFLClient
from driftfl.client.objectives import OBJECTIVES, build_objective  # noqa: E402
from driftfl.client.objectives.csd import (class_prototypes, csd_mask,  # noqa: E402
                                           prototype_reply)
from driftfl.client.train import logit_shift  # noqa: E402
from driftfl.common.augment import DSA_TRANSFORMS, SiameseAugment  # noqa: E402
from driftfl.dcfl.settings import CondensationSettings
from driftfl.common.config import compose  # noqa: E402
from driftfl.common.evaluation import evaluate  # noqa: E402
from driftfl.common.models import build_model  # noqa: E402
from driftfl.common.privacy import PrivacySettings, SecAggSettings  # noqa: E402
from driftfl.common.protocol import (CLASS_PHI, CONFIG, CONTROL, CREDIBILITY,  # noqa: E402
                                     FEATURE_PROTOTYPES, FISHER_PENALTY, PROTOTYPES,
                                     PROTOTYPES_IN_REPLY, PROXIMAL_MU, TEACHER, load_arrays)
from driftfl.common.training import CrossEntropy, TrainSettings, train_locally  # noqa: E402
from driftfl.methods import build_strategy, check_experiment  # noqa: E402
from driftfl.strategies.parts.aux_set import AuxSet

CLASSES, SHAPE, SAMPLES = 4, (1, 16, 16), 64
MLP = {"name": "mlp", "hidden": [32, 16], "projection": 8}  # projection: MOON's head
EXPERIMENT = SimpleNamespace(local_epochs=2, batch_size=16, lr=0.05, momentum=0.9,
                             weight_decay=1e-4, privacy=PrivacySettings(),
                             secagg=SecAggSettings())
# every registered objective needs its settings here: one missing fails the check
PARAMS = {
    "ce": {}, "prox": {"mu": 0.1},
    "csd": {"mu": 0.1, "tau": 4.0, "similarity": True, "mask": "adaptive"},
    "lsd": {"beta": 0.3, "temperature": 2.0}, "ntd": {"beta": 1.0, "tau": 1.0},
    "gkd": {"gamma": 0.2, "tau": 2.0},
    "ssd": {"lam": 0.05, "psi": "sqrt", "distill_loss": "selective"},
    "cad": {"gamma_min": 0.25, "gamma_max": 0.5, "temperature": 1.0},  # with class-phi: aux
    "scaffold": {"divisor": "effective"}, "dyn": {"alpha": 0.1},
    "moon": {"mu": 1.0, "tau": 0.5}, "proto": {"mu": 1.0}, "curv": {"lam": 0.1},
}
# float results after a few SGD steps: rtol per element, atol a share of the array's largest
# magnitude (so that an array of small values, such as FedCurv's Fisher ~1e-6, is compared too)
CLOSE = {"rtol": 1e-3, "atol": 1e-4}


class Checks:
    """Runs each check on the CPU and on the second device and keeps the failures."""

    def __init__(self, device: str):
        self.device, self.failures = device, []

    def report(self, name: str, ok: bool, detail: str = "") -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}".rstrip(), flush=True)
        if not ok:
            self.failures.append(name)

    def compare(self, name: str, run: Callable[[str], object], detail=None, **tolerance) -> None:
        """``run(device)`` on both devices; its results (tensors, records, numbers, in dicts
        and lists) must agree. ``detail(result)`` adds to the line."""
        try:
            cpu, other = run("cpu"), run(self.device)
        except Exception as err:  # a path that fails on one device fails its check, no more
            self.report(name, False, f"raised {err!r}")
            return
        self.report(name, agree(cpu, other, **{**CLOSE, **tolerance}),
                    detail(other) if detail else "")


def plain(value):
    """Tensors, records and containers as NumPy arrays, dicts and lists, for comparing."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, Array):
        return value.numpy()
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def agree(a, b, rtol: float, atol: float) -> bool:
    """Whether a and b have the same structure and values (``CLOSE``; integers exactly)."""
    a, b = plain(a), plain(b)
    if isinstance(a, dict) or isinstance(b, dict):
        return (isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys()
                and all(agree(a[k], b[k], rtol, atol) for k in a))
    if isinstance(a, list) or isinstance(b, list):
        return (isinstance(a, list) and isinstance(b, list) and len(a) == len(b)
                and all(agree(x, y, rtol, atol) for x, y in zip(a, b)))
    if isinstance(a, str) or isinstance(b, str) or a is None or b is None:
        return a == b
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype.kind != b.dtype.kind:
        return False
    if a.dtype.kind in "biu":  # labels, counts, masks: exactly
        return np.array_equal(a, b)
    magnitudes = np.abs(np.concatenate([a.ravel(), b.ravel()]).astype(np.float64))
    magnitudes = magnitudes[np.isfinite(magnitudes)]
    scale = magnitudes.max() if magnitudes.size else 0.0
    return np.allclose(a, b, rtol=rtol, atol=atol * scale, equal_nan=True)


def model(spec, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(spec if isinstance(spec, dict) else {"name": spec}, SHAPE, CLASSES)


def arrays_of(net: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in net.state_dict().items()}


def weights(net: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().cpu() for p in net.parameters()]


def records_for(teacher: torch.nn.Module, rng: np.random.Generator) -> dict:
    """What the servers send with a train message, one of each (every objective's ``needs``)."""
    params = {k: v.detach().numpy() for k, v in teacher.named_parameters()}
    small = {k: (0.01 * rng.standard_normal(v.shape)).astype(np.float32)
             for k, v in params.items()}
    fisher = {k: np.abs(v) * 10 for k, v in small.items()}
    width = teacher.head.in_features
    return {
        TEACHER: ArrayRecord({k: Array(v) for k, v in arrays_of(teacher).items()}),
        PROTOTYPES: ArrayRecord({"prototypes": Array(np.eye(CLASSES, dtype=np.float32))}),
        CREDIBILITY: ArrayRecord({"matrix": Array(
            (0.7 * np.eye(CLASSES) + 0.075).astype(np.float32))}),
        CLASS_PHI: ArrayRecord({"phi": Array(np.linspace(-0.5, 0.5, CLASSES).astype(np.float32))}),
        CONTROL: ArrayRecord({k: Array(v) for k, v in small.items()}),
        FEATURE_PROTOTYPES: ArrayRecord({
            "prototypes": Array(rng.standard_normal((CLASSES, width)).astype(np.float32)),
            "present": Array(np.arange(CLASSES) < CLASSES - 1)}),  # one class without
        FISHER_PENALTY: ArrayRecord(
            {**{f"penalty.{k}": Array(f) for k, f in fisher.items()},
             **{f"anchor.{k}": Array(f * params[k]) for k, f in fisher.items()}}),
        CONFIG: ConfigRecord({PROXIMAL_MU: PARAMS["prox"]["mu"], PROTOTYPES_IN_REPLY: True}),
    }


def node_job(device: str, records: dict, context: Context, x, y):
    """What an objective and DCFL's client read of a job: the message's records, the node's
    state, the experiment's training settings, a model factory, the local data."""
    content = RecordDict(records)

    def load(record: str) -> torch.nn.Module:
        net = model(MLP, seed=1)
        load_arrays(net, content[record])
        return net.to(device)

    return SimpleNamespace(message=SimpleNamespace(content=content), context=context,
                           experiment=EXPERIMENT, num_classes=CLASSES, model=load,
                           tensors=lambda: (x.to(device), y.to(device)))


def two_rounds(method: str, device: str, x, y, records: dict) -> dict:
    """Two rounds of one node training ``method``; the second starts from the first's model."""
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    net, out = model(MLP).to(device), {}
    x, y = x.to(device), y.to(device)
    for round_ in (1, 2):
        job = node_job(device, records, context, x, y)
        if method == "csd":  # the prototype phase, whose teacher logits the training reuses
            out[f"prototypes {round_}"] = prototype_reply(job)[0]
        objective = build_objective(method, PARAMS[method], job)
        before = net(x[:32]).detach()
        stats = train_locally(net, x, y, TrainSettings.local_stage(EXPERIMENT), objective,
                              torch.Generator().manual_seed(round_))
        objective.after_training(net, stats)
        out[f"round {round_}"] = {"loss": stats.mean_loss, "steps": stats.steps,
                                  "shift": logit_shift(before, net, x[:32]),
                                  "diagnostics": objective.diagnostics(),
                                  "reply": objective.reply_records()}
    return {**out, "weights": weights(net), "state": context.state}


def check_objectives(checks: Checks, x, y, records: dict) -> None:
    for method in sorted(OBJECTIVES):
        if method not in PARAMS:
            checks.report(f"objective {method}", False, "has no settings in PARAMS here")
            continue
        checks.compare(f"objective {method}", lambda d: two_rounds(method, d, x, y, records),
                       lambda r: f"loss {r['round 1']['loss']:.5f} {r['round 2']['loss']:.5f}")


def check_models(checks: Checks, x, y) -> None:
    settings = TrainSettings(1, 16, 0.05, 0.9, 1e-4)

    def forward_and_train(name: str, device: str):
        net = model(name).to(device).eval()
        logits = net(x[:32].to(device)).detach()
        stats = train_locally(net, x[:32].to(device), y[:32].to(device), settings,
                              CrossEntropy(), torch.Generator().manual_seed(5))
        return {"logits": logits, "loss": stats.mean_loss}

    for name in ("mlp", "cnn", "lenet5", "resnet18"):
        checks.compare(f"model {name}", lambda d: forward_and_train(name, d),
                       lambda r: f"loss {r['loss']:.4f}")


def check_server_and_probes(checks: Checks, x, y) -> None:
    teacher, shifted = model(MLP, seed=1), model(MLP, seed=2)
    checks.compare("central evaluation", lambda d: evaluate(
        teacher.to(d), x.to(d), y.to(d), 32, CLASSES), lambda r: f"accuracy {r[1]:.4f}")
    checks.compare("logit shift", lambda d: logit_shift(
        teacher.to(d)(x.to(d)).detach(), shifted.to(d), x.to(d)))
    logits = teacher.cpu()(x).detach()
    checks.compare("class prototypes", lambda d: class_prototypes(logits.to(d), y.to(d), CLASSES))
    for mode in ("adaptive", "forcible"):
        checks.compare(f"csd mask {mode}", lambda d: csd_mask(logits.to(d), y.to(d), mode))
    arrays = arrays_of(teacher)

    def aux_set(device: str):
        aux = AuxSet(x.to(device), y.to(device), model(MLP, seed=3).to(device), CLASSES)
        return {"confusion": aux.confusion(arrays), "class phi": aux.class_phi(arrays)}

    checks.compare("aux set (credibility, class phi)", aux_set)


def check_augment(checks: Checks, x) -> None:
    images = x[:8]

    def augmented(family: str, device: str):
        pixels = images.to(device).requires_grad_(True)
        augment = SiameseAugment((family,))
        shared, each = augment(pixels, 7), augment(pixels, 7, per_sample=True)
        gradient, = torch.autograd.grad((shared ** 2).sum() + (each ** 2).sum(), pixels)
        return {"shared": shared, "per sample": each, "gradient": gradient}

    for family in DSA_TRANSFORMS:
        checks.compare(f"dsa {family}", lambda d: augmented(family, d))


def check_condensation(checks: Checks, x, y) -> None:
    def condensed(method: str, device: str):
        losses = []
        config = CondenseConfig(method=method, ipc=2, iterations=2, lr=0.1, real_per_class=8,
                                outer_loop=2, inner_loop=2, net_lr=0.01, log_every=1)
        images, labels = condense(
            x.to(device), y.to(device), CLASSES, config,
            make_network=lambda: model("lenet5"), augment=SiameseAugment(DSA_TRANSFORMS),
            generator=torch.Generator().manual_seed(3),
            progress=lambda _, loss, __: losses.append(loss))
        return {"images": images, "labels": labels, "losses": losses}

    for method in ("dm", "dc", "dsa"):
        checks.compare(f"condense {method}", lambda d: condensed(method, d),
                       lambda r: f"matching loss {r['losses'][-1]:.4g}", rtol=1e-3, atol=1e-3)


def check_dcfl(checks: Checks, x, y) -> None:
    received = (x[:12] * 0.5, y[:12])  # stands in for the condensed images a server sends

    def client(use: str, device: str):
        settings = CondensationSettings(finetune_epochs=2, finetune_batch_size=8,
                                        finetune_lr=0.01, condensed_use=use)
        context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
        job = node_job(device, records_for(model(MLP, 1), np.random.default_rng(0)), context,
                       x, y)
        net = model(MLP).to(device)
        stats = DCFLClient(settings, job).train(
            net, x.to(device), y.to(device), build_objective("prox", {}, job),
            torch.Generator().manual_seed(4), received)
        return {"weights": weights(net), "steps": stats.steps, "loss": stats.mean_loss}

    for use in ("finetune", "mix"):
        checks.compare(f"dcfl client {use}", lambda d: client(use, d),
                       lambda r: f"loss {r['loss']:.5f}")

    def server(device: str):
        cfg = check_experiment(compose(["strategy=dcfl", "model=mlp", f"device={device}",
                                        "strategy.pretrain_epochs=2",
                                        "strategy.finetune_batch_size=16",
                                        "strategy.filter_ratio=0.25"]))
        strategy = build_strategy(cfg, model(MLP))
        start = arrays_of(model(MLP, seed=1))
        strategy.global_arrays = start
        kept = strategy.filtered((x[:40].numpy(), y[:40].numpy()))
        # the pre-training's tensor work: the one training loop, with DSA, on the server's device
        net = strategy.scratch(start)
        train_locally(net, x.to(device), y.to(device), strategy.pretrain_settings,
                      CrossEntropy(), torch.Generator().manual_seed(cfg.seed),
                      augment=strategy.augment)
        return {"filtered": kept, "pretrained": weights(net)}

    checks.compare("dcfl server (filter, pre-training)", server)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split(". ")[0] + ".")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="the device compared with the CPU (cpu: checks the script itself)")
    device = parser.parse_args(argv).device
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: error: PyTorch sees no CUDA GPU here; run it on a machine with one, "
              "or with --device cpu to check the script itself", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # tiny models: more threads only add overhead (4x on 2 busy cores)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name(0) if device == "cuda" else "the CPU against itself"
    print(f"torch {torch.__version__}, cpu against {device} ({name})", flush=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, *SHAPE, generator=g)
    y = torch.arange(SAMPLES) % CLASSES  # every class held, condensation included
    checks = Checks(device)
    check_objectives(checks, x, y, records_for(model(MLP, seed=1), np.random.default_rng(0)))
    check_models(checks, x, y)
    check_server_and_probes(checks, x, y)
    check_augment(checks, x)
    check_condensation(checks, x, y)
    check_dcfl(checks, x, y)
    print(f"{len(checks.failures)} failed: {', '.join(checks.failures)}" if checks.failures
          else f"all {device} checks passed", flush=True)
    return 1 if checks.failures else 0


if __name__ == "__main__":
    sys.exit(main())
