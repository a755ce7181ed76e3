"""A reproducible busy machine: one process per core that spins until the block ends.

The speed benchmarks run their "loaded" rows inside :func:`busy_cores`, so the load
does not depend on who else uses the machine (that load is recorded too, with
``uptime``). The processes are this benchmark's own children, ended by their ids.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

SPIN = (
    "import os\n"
    "parent = os.getppid()\n"
    "while os.getppid() == parent:  # ends by itself if the benchmark dies without ending it\n"
    "    for _ in range(1_000_000):\n"
    "        pass\n"
)


@contextlib.contextmanager
def busy_cores(count: int) -> Iterator[list[int]]:
    """Run ``count`` spinning Python processes for the duration of the block; yields
    their process ids. ``count=0`` adds no load."""
    children = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]
    try:
        yield [child.pid for child in children]
    finally:
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as ``uptime`` shows them."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())
