"""Check driftfl's GPU paths against the CPU: every local objective through the one training loop,
central evaluation, the logit-shift probe, FedCSD's prototypes and mask, and the server's
aux set (FedSSD's credibility, FedCAD's class phi). Each runs on both devices from the same
start; the results must agree. Prints one line per check and exits 1 on any mismatch.

    python scripts/gpu_check.py          (on a machine with a CUDA GPU)
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict  # noqa: E402

from driftfl.client.objectives import build_objective  # noqa: E402
from driftfl.client.objectives.csd import class_prototypes, csd_mask  # noqa: E402
from driftfl.client.train import TrainSettings, logit_shift, train_locally  # noqa: E402
from driftfl.common.evaluation import evaluate  # noqa: E402
from driftfl.common.models import build_model  # noqa: E402
from driftfl.common.protocol import (CLASS_PHI, CONFIG, CREDIBILITY, PROTOTYPES,  # noqa: E402
                                     PROXIMAL_MU, TEACHER)
from driftfl.strategies.aux_set import AuxSet  # noqa: E402

CLASSES, SHAPE = 4, (1, 8, 8)
PARAMS = {
    "ce": {}, "prox": {"mu": 0.1},
    "csd": {"mu": 0.1, "tau": 4.0, "similarity": True, "mask": "adaptive"},
    "lsd": {"beta": 0.3, "temperature": 2.0}, "ntd": {"beta": 1.0, "tau": 1.0},
    "gkd": {"gamma": 0.2, "tau": 2.0},
    "ssd": {"lam": 0.05, "psi": "sqrt", "distill_loss": "selective"},
    "cad": {"gamma_min": 0.25, "gamma_max": 0.5, "temperature": 1.0},  # with class-phi: aux
}
failures = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}", flush=True)
    if not ok:
        failures.append(name)


def model(name: str, seed: int = 0, shape=SHAPE) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model({"name": name}, shape, CLASSES)


def job_for(device: str, teacher: torch.nn.Module, records: dict):
    """What an objective sees of a message: its records, the node state, a model factory."""
    content = {TEACHER: ArrayRecord({k: Array(v.detach().cpu().numpy())
                                     for k, v in teacher.state_dict().items()}), **records}
    state = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})

    def load(record):
        m = model("mlp", seed=1)
        m.load_state_dict({k: torch.from_numpy(np.array(a.numpy()))
                           for k, a in content[record].items()})
        return m.to(device)

    return SimpleNamespace(message=SimpleNamespace(content=content), context=state, model=load)


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU here: this check is for a machine with one")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(96, *SHAPE, generator=g), torch.randint(0, CLASSES, (96,), generator=g)
    teacher = model("mlp", seed=1)
    records = {
        PROTOTYPES: ArrayRecord({"prototypes": Array(np.eye(CLASSES, dtype=np.float32))}),
        CREDIBILITY: ArrayRecord({"matrix": Array(
            (0.7 * np.eye(CLASSES) + 0.075).astype(np.float32))}),
        CLASS_PHI: ArrayRecord({"phi": Array(np.linspace(-0.5, 0.5, CLASSES).astype(np.float32))}),
        CONFIG: ConfigRecord({PROXIMAL_MU: PARAMS["prox"]["mu"]}),
    }
    settings = TrainSettings(epochs=2, batch_size=16, lr=0.05, momentum=0.9, weight_decay=1e-4)

    for method, params in PARAMS.items():
        weights, losses = {}, {}
        for device in ("cpu", "cuda"):
            net = model("mlp").to(device)
            objective = build_objective(method, params, job_for(device, teacher, records))
            stats = train_locally(net, x.to(device), y.to(device), settings, objective,
                                  torch.Generator().manual_seed(5))
            weights[device] = [p.detach().cpu() for p in net.parameters()]
            losses[device] = stats.mean_loss
            diagnostics = objective.diagnostics()
        close = all(torch.allclose(a, b, rtol=1e-3, atol=1e-4)
                    for a, b in zip(weights["cpu"], weights["cuda"]))
        check(f"train {method:<5}", close and abs(losses["cpu"] - losses["cuda"]) < 1e-3,
              f"loss cpu {losses['cpu']:.5f} cuda {losses['cuda']:.5f} {diagnostics}")

    images = torch.randn(32, 1, 28, 28, generator=g)  # the conv models want real image sizes
    for name in ("cnn", "lenet5", "resnet18"):
        net = model(name, shape=(1, 28, 28)).cuda()
        stats = train_locally(net, images.cuda(), y[:32].cuda(), settings,
                              build_objective("ce", {}), torch.Generator().manual_seed(5))
        check(f"train {name} on cuda", np.isfinite(stats.mean_loss), f"loss {stats.mean_loss:.4f}")

    cpu_eval = evaluate(teacher, x, y, 32, CLASSES)
    gpu_eval = evaluate(teacher.cuda(), x.cuda(), y.cuda(), 32, CLASSES)
    check("evaluate", abs(cpu_eval[0] - gpu_eval[0]) < 1e-4 and cpu_eval[1] == gpu_eval[1]
          and np.allclose(cpu_eval[2], gpu_eval[2]), f"acc {gpu_eval[1]:.4f}")
    teacher = teacher.cpu()
    before = teacher(x).detach()
    shifted = model("mlp", seed=2)
    check("logit shift", abs(logit_shift(before, shifted, x) -
                             logit_shift(before.cuda(), shifted.cuda(), x.cuda())) < 1e-4)

    logits = teacher(x).detach()
    cpu_p, cpu_c = class_prototypes(logits, y, CLASSES)
    gpu_p, gpu_c = class_prototypes(logits.cuda(), y.cuda(), CLASSES)
    check("class prototypes", torch.allclose(cpu_p, gpu_p.cpu(), atol=1e-5)
          and torch.equal(cpu_c, gpu_c.cpu()))
    for mode in ("adaptive", "forcible"):
        check(f"csd mask {mode}", torch.equal(csd_mask(logits, y, mode),
                                              csd_mask(logits.cuda(), y.cuda(), mode).cpu()))

    arrays = {k: v.detach().numpy() for k, v in teacher.state_dict().items()}
    on = {d: AuxSet(x.to(d), y.to(d), model("mlp", seed=3).to(d), CLASSES)
          for d in ("cpu", "cuda")}
    check("aux set confusion", np.allclose(on["cpu"].confusion(arrays),
                                             on["cuda"].confusion(arrays)))
    check("aux set class phi", np.allclose(on["cpu"].class_phi(arrays),
                                             on["cuda"].class_phi(arrays), atol=1e-5))
    print(f"{len(failures)} failed" if failures else "all GPU checks passed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
