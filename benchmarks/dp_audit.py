"""An empirical audit of user-level DP that can fail: for each release mode, real and deliberately
broken, a lower bound on epsilon from a canary-distinguishing game, against the release's own
accounted epsilon (driftfl.privacy_audit explains the game).

    PYTHONPATH=. .venv/bin/python benchmarks/dp_audit.py [--trials 2000] [--sigma 4] \\
        [--rounds 1] [--clients 100] [--rate 0.1] [--per-round 10]

Threat model: a curious server that fixed the federation's data (N clients with fixed updates,
one canary client whose clipped update is C e in one world and zero in its neighbour) and
knows the run's config.yaml, seed included. It sees, per mode: central, the released mean
update (the trusted server's sample and noise are secret); distributed, the canary's own
noised reply; distributed + SecAgg+, only the sum of the round's replies. It guesses the world
from the projection on e (after subtracting the noise it regenerates from the seed, when that
helps), its threshold chosen on half the runs; the other half give Clopper-Pearson bounds on
its error rates, and so a lower bound on epsilon at 95 % confidence.

A real mechanism passes when its lower bound stays at or below its claim; a mechanism is
flagged when the bound exceeds the claim: it provably leaks more than it accounts for. The
broken ones draw their noise from the seed (an old version's default_rng([seed, round])) or
add a tenth of the noise they state. A claim above the audit's ceiling (what the trials can
show at most, printed below the table) cannot be flagged at this many trials.
"""

from __future__ import annotations

import argparse
import time

from driftfl.privacy_audit import audits, ceiling, run


def verdict(result, reach: float) -> str:
    if result.flagged:
        return "yes"
    return "no" if result.claimed < reach else "no (claim beyond the audit's reach)"


def row(result, reach: float) -> str:
    a, cols = result.audit, result.columns
    return (f"| {a.label} | {a.sigma:g} | {cols['dp_sigma']:.3g} | {cols['dp_q']:g} | "
            f"{result.claimed:.3g} | {result.lower_bound:.3g} | {result.statistic} | "
            f"{result.fpr:.3f} / {result.fnr:.3f} | {verdict(result, reach)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000, help="runs per world")
    # 4: every claim, distributed's one share sigma / sqrt(8) included, within what 2000
    # runs can show, so that every broken row can be flagged
    parser.add_argument("--sigma", type=float, nargs="+", default=[4.0],
                        help="privacy.noise_multiplier (several: rows for each)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds per run, the canary in every one")
    parser.add_argument("--clients", type=int, default=100, help="N (central's population)")
    parser.add_argument("--rate", type=float, default=0.1, help="central: q")
    parser.add_argument("--per-round", type=int, default=10, help="distributed: m")
    args = parser.parse_args()
    sizes = {"num_clients": args.clients, "rate": args.rate, "per_round": args.per_round}
    start = time.perf_counter()
    print(f"| mode | sigma | dp_sigma | dp_q | claimed eps ({args.rounds} round(s), "
          "delta 1e-5) | empirical eps lower bound (95 %) | statistic | held-out FPR / FNR "
          "| flagged |")
    print("|---|---|---|---|---|---|---|---|---|")
    for sigma in args.sigma:
        for audit in audits(sigma, args.rounds, **sizes):
            print(row(run(audit, args.trials), ceiling(args.trials)), flush=True)
    print(f"\n{args.trials} runs per world ({args.trials // 2} choose the threshold, the rest "
          f"judge it); the most any bound can show at this count: {ceiling(args.trials):.3g}; "
          f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
