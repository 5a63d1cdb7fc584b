"""Every child has a memory cap: the address space on CPU targets, and
where a GPU driver's reservations rule that out, the writable private
memory it may hold (RLIMIT_DATA). Checked in a process of its own, as a
child applies it after its imports."""

from __future__ import annotations

import subprocess
import sys

ALLOCATE = """
from runners.harness.child import limit_memory
limit_memory({limits!r})
try:
    block = bytearray({size})
    print("allocated")
except MemoryError:
    print("refused")
"""


def allocate(size: int, **limits) -> str:
    code = ALLOCATE.format(limits=limits, size=size)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_gpu_child_without_an_address_space_cap_is_held_to_its_data_limit():
    gpu = {"address_space_extra_bytes": None, "data_extra_bytes": 256 * 2**20}
    assert allocate(2**30, **gpu) == "refused"
    assert allocate(64 * 2**20, **gpu) == "allocated"


def test_a_cpu_child_keeps_its_address_space_cap():
    cpu = {"address_space_extra_bytes": 256 * 2**20, "data_extra_bytes": 2**40}
    assert allocate(2**30, **cpu) == "refused"
