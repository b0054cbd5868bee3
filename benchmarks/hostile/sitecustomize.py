"""Benchmark-only: one real client of a `driftfl run` attacks from inside SecAgg+ (see
benchmarks/secagg_attack.py, which puts this directory on PYTHONPATH). Imported by every Python
process of the run; it acts only where DRIFTFL_BENCH_ATTACK names an attack:

- ``scale:F``  the client masks F times its update (F=-20: its update reversed, x20), as
  Flower's mod does for any update: quantised within the clipping range it was sent;
- ``sign``     each coordinate at the clipping range, against its update's sign: the longest
  vector the protocol lets one client carry (the range is in the setup stage's config);
- ``forge``    a masked vector off the protocol: uniform integers added to the honest one.

The attacker is the first client to reach the collect stage (its node id is written to
DRIFTFL_BENCH_ATTACK_DIR/attacker, O_EXCL across Ray workers), in every round after."""

import os

ATTACK = os.environ.get("DRIFTFL_BENCH_ATTACK")

if ATTACK:
    import importlib
    from pathlib import Path

    import numpy as np
    from flwr.common import (bytes_to_ndarray, ndarray_to_bytes, ndarrays_to_parameters,
                             parameters_to_ndarrays)
    from flwr.common.secure_aggregation.secaggplus_constants import Key

    module = importlib.import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")
    honest = module._collect_masked_vectors

    def is_attacker(nid: int) -> bool:
        marker = Path(os.environ["DRIFTFL_BENCH_ATTACK_DIR"]) / "attacker"
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.write(fd, str(nid).encode())
            os.close(fd)
            return True
        except FileExistsError:
            return marker.read_text().strip() == str(nid)

    def attacking(state, configs, num_examples, parameters):
        if not is_attacker(state.nid):
            return honest(state, configs, num_examples, parameters)
        arrays = parameters_to_ndarrays(parameters)
        kind, _, factor = ATTACK.partition(":")
        if kind == "scale":
            arrays = [a * float(factor) for a in arrays]
        elif kind == "sign":  # weighted by num_examples / max_weight before clipping: undo it
            reach = state.clipping_range * state.max_weight / max(1, num_examples)
            arrays = [-np.sign(a) * reach for a in arrays]
        out = honest(state, configs, num_examples, ndarrays_to_parameters(arrays))
        if kind == "forge":
            rng = np.random.default_rng()
            out[Key.MASKED_PARAMETERS] = [
                ndarray_to_bytes((v + rng.integers(0, state.mod_range, v.shape)) % state.mod_range)
                for v in map(bytes_to_ndarray, out[Key.MASKED_PARAMETERS])]
        return out

    module._collect_masked_vectors = attacking
