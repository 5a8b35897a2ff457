"""glibc's malloc with a fixed mmap threshold, so the buffers of closed TLS connections go back to the system.

Every TLS connection asyncio opens holds a 256 KiB read buffer (asyncio.sslproto). glibc serves blocks that
large with mmap, but raises its threshold to the size of each such block freed (the dynamic mmap threshold):
after the first few, the buffers of the hundreds of Talos connections a converging fleet opens come from the
heap, and the heap keeps its high-water mark once they are closed. bench_idle measured it: at 200 clusters x 4
machines the idle daemon held 146 MiB with the adjustment and 128 MiB without it. Setting M_MMAP_THRESHOLD
explicitly turns the adjustment off (mallopt(3)); glibc's own default, 128 KiB, is kept as the value.
"""

from __future__ import annotations

import ctypes
import os

M_MMAP_THRESHOLD = -3  # malloc.h
THRESHOLD = 128 * 1024


def fix_mmap_threshold() -> bool:
    """True when set; False where there is nothing to do (not glibc, or the operator set MALLOC_MMAP_THRESHOLD_)."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False  # the operator's own tuning wins
    try:
        libc = ctypes.CDLL(None)  # the symbols the process already has
    except OSError:
        return False
    if not hasattr(libc, "gnu_get_libc_version"):
        return False  # musl and others: no dynamic threshold to turn off
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD))
