// Populate cost per GiB: plain pages a slice at a time (the old full-cache growth), huge pages kept, huge pages
// split into plain ones (touch + MADV_COLD, the new full-cache growth). Fresh mappings each; median of 3.
#include <sys/mman.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cstdlib>
static const size_t PAGE = 4096, HUGE = 2 << 20;
static double run(int mode, size_t bytes) {
    uint8_t* raw = (uint8_t*)mmap(0, bytes + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    uint8_t* p = (uint8_t*)(((uintptr_t)raw + HUGE - 1) / HUGE * HUGE);
    madvise(p, bytes, mode == 0 ? MADV_NOHUGEPAGE : MADV_HUGEPAGE);
    auto t0 = std::chrono::steady_clock::now();
    if (mode == 0) {
        for (size_t o = 0; o < bytes; o += 162 * PAGE) madvise(p + o, std::min<size_t>(162 * PAGE, bytes - o), 23);
    } else {
        for (size_t o = 0; o < bytes; o += HUGE) {
            madvise(p + o, HUGE, 23);
            if (mode == 2) {
                for (size_t a = 0; a < HUGE; a += PAGE) ((volatile uint8_t*)p)[o + a] = 1;
                madvise(p + o + PAGE, HUGE - PAGE, 20);
            }
        }
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    munmap(raw, bytes + HUGE);
    return s * (1 << 30) / bytes;
}
int main(int argc, char** argv) {
    if (argc > 1) { int m = atoi(argv[1]); const char* n[] = {"plain-slices", "huge-kept", "huge-split"}; printf("%s %.3f s/GiB\n", n[m], run(m, 2ULL << 30)); return 0; }
    const char* names[] = {"plain, a slice (162 pages) at a time", "huge pages kept", "huge pages split (touch + MADV_COLD)"};
    for (int m : {0, 1, 2, 0, 1, 2, 0, 1, 2}) printf("%-40s %.3f s/GiB\n", names[m], run(m, 1ULL << 30));
}
