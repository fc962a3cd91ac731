"""Process-wide settings the gateway's memory per connection depends on."""

from __future__ import annotations

import ctypes
import logging
import os
import platform

log = logging.getLogger(__name__)

# glibc's mallopt parameter for the size from which an allocation gets a mapping of its own.
M_MMAP_THRESHOLD = -3
DEFAULT_MMAP_THRESHOLD = 128 * 1024


def tune_allocator(threshold: int = DEFAULT_MMAP_THRESHOLD) -> bool:
    """Give every allocation of `threshold` bytes or more a mapping of its own, for the process's life (glibc).

    uvloop's TLS layer reserves a 256 KiB read buffer per connection, of which a page or two is ever written.
    glibc starts by mapping such blocks on their own, but raises that threshold each time one is freed (up to
    32 MiB), so after the first connections closed, the buffers come from the heap, between small long-lived
    objects, and the heap pages they pass through stay resident. With a fixed threshold each buffer stays a
    mapping whose unwritten pages cost nothing and which goes back to the system with its connection: about 7 KiB
    less per watch and 3 KiB less per idle connection in `bench/gateway_bench.py`, with no measurable CPU cost
    (one mapping per connection, not per request). Adjacent mappings merge, so the kernel's limit on mappings
    (vm.max_map_count, 65,530 by default) stays far above the gateway's connection limit.

    An operator's own MALLOC_MMAP_THRESHOLD_ wins; on another C library nothing changes. True when applied."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, threshold) != 1:
        log.warning("the allocator's mmap threshold could not be set; the gateway works, with more memory per "
                    "connection")
        return False
    return True
