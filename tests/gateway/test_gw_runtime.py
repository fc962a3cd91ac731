"""The process-wide allocator setting of `peering run` and its workers, checked in fresh interpreters."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = r"""
import ctypes, sys
from gateway.runtime import tune_allocator
applied = tune_allocator() if sys.argv[1] == "tune" else None
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
# A freed 256 KiB block (a TLS read buffer of a closed connection) is what makes glibc raise its threshold.
libc.free(libc.malloc(256 * 1024))
block = libc.malloc(256 * 1024)
in_heap = False
for line in open("/proc/self/maps"):
    if line.rstrip().endswith("[heap]"):
        start, end = (int(x, 16) for x in line.split()[0].split("-"))
        in_heap = in_heap or start <= block < end
print(applied, in_heap)
"""


def _probe(mode: str, **env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"} | env
    return subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                          env=environment, timeout=60).stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc/self/maps")
def test_large_buffers_keep_mappings_of_their_own_after_tuning():
    assert _probe("plain") == ["None", "True"]  # without it, the next buffer comes from the heap
    assert _probe("tune") == ["True", "False"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc/self/maps")
def test_an_operators_own_threshold_is_left_alone():
    # 1 MiB from the environment: the 256 KiB block stays on the heap, and tune_allocator does not override.
    assert _probe("tune", MALLOC_MMAP_THRESHOLD_=str(1024 * 1024)) == ["False", "True"]
