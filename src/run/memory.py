"""Host memory: keep what glibc's malloc frees for reuse, instead of handing it back to the OS every step.

A CPU training step allocates and frees the same large activation buffers over and over. glibc serves big
blocks with fresh mmap pages and trims the top of its heap on free, with thresholds that adapt to the
history of the process: depending on that history, each step may page-fault its whole working set back in,
and the same run is fast or slow at random (the template's benchmark showed it). Fixed thresholds make
every run the fast one; memory stays at the peak a step needs.
"""

import ctypes
import logging
import os

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # blocks below this come from the heap (glibc's maximum on 64-bit)
TRIM_THRESHOLD = 2**30  # the heap is trimmed only when this much is free at its top
# Set by a user for this process: their choice wins.
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def keep_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (and the workers it forks); whether it did.

    Does nothing where the C library is not glibc (macOS, Windows, musl) or where the user already set
    malloc's thresholds through the environment.
    """
    if not glibc() or any(name in os.environ for name in _USER_SETTINGS):
        return False
    mallopt = ctypes.CDLL(None).mallopt
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if done:
        log.debug(
            f"malloc keeps freed memory: mmap threshold {MMAP_THRESHOLD}, trim threshold {TRIM_THRESHOLD}"
        )
    return done


def glibc() -> bool:
    """Whether this process runs on GNU's C library, whose malloc has these thresholds."""
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (AttributeError, ValueError, OSError):  # no confstr (Windows), or not a GNU system (macOS)
        return False
