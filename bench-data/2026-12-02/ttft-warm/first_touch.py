"""First touch of anonymous memory on this VM: MADV_POPULATE_WRITE of N MiB (huge pages or not), then again after
MADV_DONTNEED. Run twice in a row: the second process gets the pages the first just freed.
    python3 first_touch.py 2048 1"""
import mmap, time, ctypes, sys
n = int(sys.argv[1]) << 20
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
p = libc.mmap(None, n, 3, 0x22 | 0x4000, -1, 0)
hp = int(sys.argv[2]) if len(sys.argv) > 2 else 1
libc.madvise(ctypes.c_void_p(p), ctypes.c_size_t(n), 14 if hp else 15)  # MADV_HUGEPAGE / NOHUGEPAGE
t = time.perf_counter()
r = libc.madvise(ctypes.c_void_p(p), ctypes.c_size_t(n), 23)
dt = time.perf_counter() - t
print(f"populate {n>>20} MiB huge={hp}: {dt*1000:.0f} ms, {n/dt/1e6:.0f} MB/s (rc {r})")
t = time.perf_counter()
libc.madvise(ctypes.c_void_p(p), ctypes.c_size_t(n), 4)  # DONTNEED
libc.madvise(ctypes.c_void_p(p), ctypes.c_size_t(n), 23)
dt = time.perf_counter() - t
print(f"  again after DONTNEED: {dt*1000:.0f} ms, {n/dt/1e6:.0f} MB/s")
