// Readings of this process and machine for the telemetry and the memory policy (Linux /proc,
// cgroup files, getrusage, mincore), and giving a file mapping's pages back. Mechanism only: nothing
// here decides anything.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace bmoe::detail {

using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

uint64_t rss_bytes();
uint64_t major_faults();
uint64_t storage_read_bytes();  // /proc/self/io read_bytes: what really came from the device

// One memory cgroup with a limit that this process sits in (itself or an ancestor, v1 or v2).
struct CgroupMemory {
    std::string path;          // e.g. "cgroup v2 /system.slice/bmoe.service" (systemd MemoryMax= lands here)
    uint64_t limit = 0;
    uint64_t usage = 0;        // everything charged: processes, page cache, shared memory
    uint64_t inactive_file = 0;  // page cache the kernel takes back first
};

struct MemoryReading {
    uint64_t mem_total = 0;
    uint64_t mem_available = 0;
    std::vector<CgroupMemory> cgroups;  // only those with a limit
    uint64_t rss_anon = 0;   // the expert page pool included
    uint64_t rss_file = 0;   // mapped file pages (dense weights with dense=mmap)
    double pressure_some_avg10 = 0;  // /proc/pressure/memory (percent), 0 where absent
};

MemoryReading read_memory();
// Mappings this process may still create under vm.max_map_count, less a reserve for everything
// else (libraries, allocator arenas); UINT64_MAX where the limit cannot be read.
uint64_t mappings_left();
// Bytes of [data, data+size) that are resident in memory (mincore).
uint64_t resident_bytes_of(const void * data, uint64_t size);
// The whole pages inside [data, data + bytes) of a read-only file mapping, returned to the kernel
// (MADV_DONTNEED: clean file pages, faulted back in from the file if touched, never corrupted; a page
// the range shares with a neighbour stays): how far into the range they start, and their bytes.
struct DroppedPages {
    uint64_t skip = 0;
    uint64_t bytes = 0;  // 0: the range holds no whole page
};
DroppedPages drop_mapped_pages(void * data, uint64_t bytes);
// This process's mappings of the file at `path` (its device and inode, /proc/self/maps).
struct FileMapping {
    void * start = nullptr;
    uint64_t bytes = 0;
    uint64_t file_offset = 0;  // of the file's byte at `start`
};
std::vector<FileMapping> file_mappings(const std::string & path);

}  // namespace bmoe::detail
