"""The Ray instance a simulation host keeps (driftfl.host): ``ray.init()`` as Flower's engine
calls it to start a private instance (no dashboard), held by this process until it is stopped,
so that every run the host gets joins it. Not `ray start --head`: that also starts a Ray Client
server, which accepts remote drivers on port 10001 of every interface.

    python ray_head.py <temporary folder>     # prints "Ray runtime started <address>"
"""

from __future__ import annotations

import sys
import time

READY = "Ray runtime started"


def main(temp_dir: str) -> None:
    import ray

    started = ray.init(include_dashboard=False, _temp_dir=temp_dir, configure_logging=False)
    print(f"{READY} {started.address_info['gcs_address']}", flush=True)
    while True:  # the host stops this process, and Ray's with it
        time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1])
