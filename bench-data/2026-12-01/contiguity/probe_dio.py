"""600 O_DIRECT reads of 648 KiB at random offsets of MODEL into three kinds of memory: memfd pages
(the old pool), private anonymous 4 KiB pages, and private anonymous memory with MADV_HUGEPAGE.

    python3 probe_dio.py MODEL
"""

import ctypes
import mmap
import os
import random
import sys
import time

SLICE = 648 * 1024
READS = 600
MADV_HUGEPAGE = 14
MAP_POPULATE = 0x8000

libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def memory(kind: str) -> mmap.mmap:
    if kind == "memfd":
        fd = os.memfd_create("probe")
        os.ftruncate(fd, SLICE * READS)
        return mmap.mmap(fd, SLICE * READS, flags=mmap.MAP_SHARED | MAP_POPULATE)
    buf = mmap.mmap(-1, SLICE * READS + (4 << 20), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if kind == "thp":
        libc.madvise(ctypes.addressof(ctypes.c_char.from_buffer(buf)), len(buf), MADV_HUGEPAGE)
    for off in range(0, len(buf), 4096):
        buf[off] = 1
    return buf


def main(model: str) -> None:
    fd = os.open(model, os.O_RDONLY | os.O_DIRECT)
    size = os.fstat(fd).st_size
    for kind in ["memfd", "anon", "thp"] * 2:
        buf = memory(kind)
        rng = random.Random(len(kind))
        start, cpu = time.monotonic(), time.process_time()
        for i in range(READS):
            offset = rng.randrange(0, (size - SLICE) // 4096) * 4096
            os.preadv(fd, [memoryview(buf)[i * SLICE:(i + 1) * SLICE]], offset)
        seconds = time.monotonic() - start
        print(kind, f"{READS * SLICE / seconds / 2**20:.0f} MiB/s cpu {time.process_time() - cpu:.2f}s")


if __name__ == "__main__":
    main(sys.argv[1])
