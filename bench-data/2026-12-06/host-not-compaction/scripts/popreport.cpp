// Huge pages populated right after the same amount was freed, and again after a pause: free page reporting
// (virtio-balloon, order 9) hands free huge-page-sized blocks to the host, whose first touch then faults there.
// Prints s/GiB, the kernel's compaction stalls and the reported KiB before/after each.
#include <sys/mman.h>
#include <unistd.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
static const size_t HUGE = 2 << 20;
static long long counter(const char* file, const char* key) {
    std::ifstream f(file); std::string k; long long v;
    if (!key) { f >> v; return v; }
    while (f >> k >> v) if (k == key) return v;
    return -1;
}
static double populate(size_t bytes, bool huge) {
    uint8_t* raw = (uint8_t*)mmap(0, bytes + HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    uint8_t* p = (uint8_t*)(((uintptr_t)raw + HUGE - 1) / HUGE * HUGE);
    madvise(p, bytes, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    auto t0 = std::chrono::steady_clock::now();
    for (size_t o = 0; o < bytes; o += HUGE) madvise(p + o, HUGE, 23 /* MADV_POPULATE_WRITE */);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    munmap(raw, bytes + HUGE);
    return s * (1 << 30) / bytes;
}
int main(int argc, char** argv) {
    const size_t bytes = (argc > 1 ? atoll(argv[1]) : 2) << 30;
    const int pause_s = argc > 2 ? atoi(argv[2]) : 10;
    const char* rep = "/sys/module/page_reporting/parameters/reported_kib";
    const char* steps[] = {"huge, first", "huge, at once again", "huge, after the pause", "huge, at once again"};
    for (int i = 0; i < 4; ++i) {
        long long r0 = counter(rep, nullptr), c0 = counter("/proc/vmstat", "compact_stall");
        if (i == 2) sleep(pause_s);
        double s = populate(bytes, true);
        printf("%-24s %.3f s/GiB  reported +%lld MiB since the step before it (and its pause)  compact_stall +%lld\n", steps[i], s,
               (counter(rep, nullptr) - r0) >> 10, counter("/proc/vmstat", "compact_stall") - c0);
    }
}
