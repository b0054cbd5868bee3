"""NumPy's BLAS on one thread in driftfl's server and client processes.

What driftfl computes in NumPy (update norms, clipping, a round's sums and distances) is vector
work that BLAS threads do not speed up; on a busy machine they wait for a core instead. Central
DP's clipping of 50 LeNet-5 replies took 0.4-1.3 s with NumPy's OpenBLAS on 2 threads against
0.013 s on one (benchmarks/dp_cost.py, 2 busy cores). Only NumPy's BLAS is limited: torch's
threads are set apart (driftfl.client.job).
"""

from __future__ import annotations

from threadpoolctl import threadpool_limits


def one_blas_thread() -> None:
    """Limit every BLAS library loaded in this process (NumPy's, SciPy's) to one thread."""
    threadpool_limits(limits=1, user_api="blas")
