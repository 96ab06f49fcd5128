"""keep_freed_memory: a freed block of a few MB stays in the heap instead of being unmapped."""

import subprocess
import sys

import pytest

# Allocates a 16 MB block and reports the bytes glibc holds in mmapped blocks while it lives
# (mallinfo2().hblkhd): the whole block when glibc serves it with mmap, nothing otherwise.
PROBE = """
import ctypes, sys
from models.allocator import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
kept = keep_freed_memory() if sys.argv[1] == "keep" else False
block = libc.malloc(16 * 1024 * 1024)
print(kept, libc.mallinfo2().hblkhd)
libc.free(ctypes.c_void_p(block))
"""


def _mmapped_bytes(mode: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_16_mb_block_comes_from_the_heap_once_freed_memory_is_kept():
    block = 16 * 1024 * 1024
    _, mmapped_by_default = _mmapped_bytes("default")
    kept, mmapped = _mmapped_bytes("keep")
    assert kept == "True"
    assert mmapped_by_default >= block
    assert mmapped <= mmapped_by_default - block
