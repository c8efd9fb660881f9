"""layout.py PID: physical contiguity of the process's big anonymous memory (the experts)"""
import struct, sys
pid = sys.argv[1]
maps = []
for l in open(f"/proc/{pid}/maps"):
    p = l.split(); a, b = (int(x, 16) for x in p[0].split("-"))
    name = p[5] if len(p) > 5 else ""
    if name == "" and p[1].startswith("rw"): maps.append((a, b))
# merge adjacent VMAs (the mirror is many), keep ranges > 256 MiB
merged = []
for a, b in sorted(maps):
    if merged and merged[-1][1] == a: merged[-1] = (merged[-1][0], b)
    else: merged.append((a, b))
big = [(a, b) for a, b in merged if b - a > 256 << 20]
f = open(f"/proc/{pid}/pagemap", "rb")
for a, b in big:
    pfns = []
    f.seek(a // 4096 * 8); data = f.read((b - a) // 4096 * 8)
    for i in range(0, len(data), 8):
        v, = struct.unpack_from("<Q", data, i)
        pfns.append(v & ((1 << 55) - 1) if v >> 63 else None)
    present = [(i, p) for i, p in enumerate(pfns) if p]
    n = len(present)
    if n == 0: continue
    contig = sum(1 for i in range(len(pfns) - 1) if pfns[i] and pfns[i + 1] == pfns[i] + 1)
    # groups of 4 (16 KiB) / 8 (32 KiB) virtually aligned pages, all present, physically contiguous and aligned
    def coal(k):
        tot = ok = 0
        for g in range(0, len(pfns) - k + 1, k):
            grp = pfns[g:g + k]
            if all(grp):
                tot += 1
                if all(grp[j] == grp[0] + j for j in range(k)) and grp[0] % k == ((a // 4096) + g) % k: ok += 1
        return ok / max(tot, 1)
    runs = n / max(1, n - contig)
    print(f"{a:x}-{b:x} {(b-a)>>20} MiB present {n*4096>>20} MiB, mean run {runs:.1f} frames, coalescable 16K {coal(4):.3f} 32K {coal(8):.3f}")
