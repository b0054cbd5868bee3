"""Which reading of DCFL's CKA tells clients apart (the matrix behind its selection).

The setting of `+experiment=dcfl_fmnist partition.alpha=0.1`, outside Flower: Fashion-MNIST,
Dirichlet(0.1) over K clients (driftfl's partition), the MLP, one common random initial model
W_0; every client trains E_c epochs of SGD (lr 0.01, momentum 0.9, batch 64, no augmentation)
from it on its own data (--waves N: in N waves, the first from W_0, each next one from the mean
of the last wave's models, as DCFL explores later clients from later global models). Then, for each reading of the classifier similarity M_ij
(head.weight W_k, |Y| x d):

- rows: `classes` (W, |Y| examples of d features: driftfl before this issue) or `features`
  (W^T, d examples of |Y| features: W e_j, the classifier's output on the j-th unit feature);
- `linear` CKA or `debiased` CKA (unbiased HSIC, Song et al. 2012 / Nguyen et al. 2021);
- of the classifier W_k or of the update W_k - W_sent (the server knows the model it sent);

it prints the off-diagonal min / median / max / std of M, `tv`: the total-variation distance
of Eq. 4's exploit distribution over all K clients from uniform (negative entries of debiased
CKA clipped to 0 for Eq. 4), `rho`: Spearman's correlation over the K(K-1)/2 pairs between M_ij
and the cosine of the two clients' label histograms (the ground truth: how alike their data
is), and `random`: the mean off-diagonal value for independent N(0, 1) matrices of W's shape.

    .venv/bin/python benchmarks/cka_readings.py                 # K = 20, E_c = 2, seed 0
    .venv/bin/python benchmarks/cka_readings.py --waves 4 --seed 1 --epochs 10

About a minute of one CPU thread for the defaults.
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import torch
from scipy.stats import spearmanr

from driftfl.common.datasets import load_dataset, to_tensors
from driftfl.common.models import build_model
from driftfl.common.partition import compute_partition
from driftfl.common.training import CrossEntropy, TrainSettings, train_locally
from driftfl.dcfl.cka import exploit_probabilities, linear_cka


def debiased_cka(x: np.ndarray, y: np.ndarray) -> float:
    """CKA from the unbiased HSIC estimator of the linear Gram matrices (rows = examples)."""
    def hsic(k, l):
        n = len(k)
        k, l = k.copy(), l.copy()
        np.fill_diagonal(k, 0)
        np.fill_diagonal(l, 0)
        return (np.sum(k * l) + k.sum() * l.sum() / ((n - 1) * (n - 2))
                - 2 / (n - 2) * k.sum(0) @ l.sum(0)) / (n * (n - 3))
    kx, ky = x @ x.T, y @ y.T
    return float(hsic(kx, ky) / np.sqrt(hsic(kx, kx) * hsic(ky, ky)))


KINDS = {"linear": linear_cka, "debiased": debiased_cka}


def matrix_of(weights: list[np.ndarray], kind: str, rows: str) -> np.ndarray:
    f = KINDS[kind]
    mats = [w if rows == "classes" else w.T for w in weights]
    n = len(mats)
    out = np.eye(n)
    for i, j in itertools.combinations(range(n), 2):
        out[i, j] = out[j, i] = f(mats[i], mats[j])
    return out


def train_clients(clients: int, epochs: int, alpha: float, seed: int, waves: int):
    torch.manual_seed(seed)
    data = load_dataset({"name": "fmnist"})
    x, y = to_tensors(data.train_x, data.train_y, data.mean, data.std)
    parts = compute_partition(data.train_y, {"name": "dirichlet", "alpha": alpha}, clients, seed)
    model0 = build_model({"name": "mlp"}, data.shape, data.num_classes)
    state = {k: v.clone() for k, v in model0.state_dict().items()}
    settings = TrainSettings(epochs, 64, 0.01, 0.9, 0.0)
    sent, heads, hists = [], [], []
    for wave in np.array_split(np.arange(clients), waves):
        trained = []
        for k in wave:
            model0.load_state_dict(state)
            sent.append(state["head.weight"].numpy().astype(np.float64).copy())
            train_locally(model0, x[parts[k]], y[parts[k]], settings, CrossEntropy(),
                          torch.Generator().manual_seed(seed * 1000 + int(k)))
            trained.append({n: v.clone() for n, v in model0.state_dict().items()})
            heads.append(trained[-1]["head.weight"].numpy().astype(np.float64))
            hists.append(np.bincount(data.train_y[parts[k]], minlength=data.num_classes))
        # the next wave starts from the plain mean of this wave's models (a FedAvg round)
        state = {n: torch.stack([t[n].float() for t in trained]).mean(0).to(v.dtype)
                 for n, v in state.items()}
    return sent, heads, np.array(hists, dtype=np.float64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--waves", type=int, default=1,
                        help="explore the clients in this many waves, each from the mean of "
                             "the last wave's models (DCFL: later clients start elsewhere)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sent, heads, hists = train_clients(args.clients, args.epochs, args.alpha, args.seed,
                                       args.waves)
    unit = hists / np.linalg.norm(hists, axis=1, keepdims=True)
    truth = unit @ unit.T
    pairs = np.triu_indices(args.clients, 1)
    rng = np.random.default_rng(args.seed)
    randoms = [rng.normal(size=heads[0].shape) for _ in range(10)]
    print(f"Fashion-MNIST, Dir({args.alpha:g}), {args.clients} clients, E_c = {args.epochs}, "
          f"{args.waves} wave(s), MLP head {heads[0].shape[0]}x{heads[0].shape[1]}, seed "
          f"{args.seed}; label-histogram cosine "
          f"over pairs: {np.median(truth[pairs]):.2f} median, {truth[pairs].min():.2f}-"
          f"{truth[pairs].max():.2f}")
    print(f"{'of':8} {'rows':9} {'kind':9} {'min':>6} {'median':>6} {'max':>6} {'std':>6} "
          f"{'tv':>6} {'rho':>6} {'random':>7}")
    for of, rows, kind in itertools.product(("weights", "update"), ("classes", "features"),
                                            ("linear", "debiased")):
        mats = heads if of == "weights" else [h - s for h, s in zip(heads, sent)]
        m = matrix_of(mats, kind, rows)
        off = m[pairs]
        p = exploit_probabilities(np.clip(m, 0, None))
        tv = 0.5 * np.abs(p - 1 / len(p)).sum()
        rho = spearmanr(off, truth[pairs]).statistic
        baseline = np.mean(matrix_of(randoms, kind, rows)[np.triu_indices(len(randoms), 1)])
        print(f"{of:8} {rows:9} {kind:9} {off.min():6.2f} {np.median(off):6.2f} "
              f"{off.max():6.2f} {off.std():6.3f} {tv:6.3f} {rho:6.2f} {baseline:7.2f}")


if __name__ == "__main__":
    main()
