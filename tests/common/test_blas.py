"""NumPy's BLAS runs on one thread in driftfl's processes (driftfl/common/blas.py)."""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from driftfl.common.blas import one_blas_thread


def test_one_blas_thread_limits_numpys_blas_and_leaves_torchs_openmp():
    import torch  # noqa: F401  (its OpenMP runtime loaded, to see it is left alone)

    with threadpool_limits(limits=2, user_api="blas"):
        np.dot(np.ones(4), np.ones(4))
        openmp = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "openmp"]
        one_blas_thread()
        blas = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
        assert blas and set(blas) == {1}
        assert [p["num_threads"] for p in threadpool_info() if p["user_api"] == "openmp"] == openmp
