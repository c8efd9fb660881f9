#include "core/telemetry.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace bmoe::detail {
namespace {

uint64_t field_from(const char * path, const std::string & key, uint64_t scale) {
    // Line by line: /proc/self/status also has lines whose value is not a number.
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line)) {
        if (line.compare(0, key.size(), key) == 0 && line.size() > key.size() &&
            (line[key.size()] == ' ' || line[key.size()] == '\t')) {
            return std::strtoull(line.c_str() + key.size(), nullptr, 10) * scale;
        }
    }
    return 0;
}

}  // namespace

uint64_t rss_bytes() {
    std::ifstream f("/proc/self/statm");
    uint64_t size = 0;
    uint64_t resident = 0;
    f >> size >> resident;
    return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

uint64_t major_faults() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<uint64_t>(ru.ru_majflt);
}

uint64_t storage_read_bytes() { return field_from("/proc/self/io", "read_bytes:", 1); }

namespace {

// A cgroup file holding one number; "max" (no limit) and absent files give UINT64_MAX.
uint64_t cgroup_value(const std::string & path) {
    std::ifstream f(path);
    std::string text;
    if (!(f >> text) || text == "max") {
        return UINT64_MAX;
    }
    try {
        return std::stoull(text);
    } catch (...) {
        return UINT64_MAX;
    }
}

// Every ancestor of `path` with a limit, innermost first.
void cgroup_limits(const std::string & base, const std::string & path, const char * version,
                   const char * limit_name, const char * usage_name, const char * inactive_key,
                   std::vector<CgroupMemory> & out) {
    for (std::string p = path;;) {
        const std::string dir = base + (p == "/" ? "" : p);
        const uint64_t limit = cgroup_value(dir + "/" + limit_name);
        const uint64_t usage = cgroup_value(dir + "/" + usage_name);
        if (limit < (1ULL << 60) && usage != UINT64_MAX) {  // v1 reports "no limit" as ~2^63
            out.push_back({std::string(version) + " " + p, limit, usage,
                           field_from((dir + "/memory.stat").c_str(), inactive_key, 1)});
        }
        if (p.empty() || p == "/") {
            return;
        }
        const size_t slash = p.rfind('/');
        p = slash == 0 || slash == std::string::npos ? "/" : p.substr(0, slash);
    }
}

double pressure_avg10() {
    std::ifstream f("/proc/pressure/memory");
    std::string word;
    while (f >> word) {
        if (word.rfind("avg10=", 0) == 0) {
            return std::atof(word.c_str() + 6);  // the first line is "some"
        }
    }
    return 0;
}

}  // namespace

MemoryReading read_memory() {
    MemoryReading r;
    r.mem_total = field_from("/proc/meminfo", "MemTotal:", 1024);
    r.mem_available = field_from("/proc/meminfo", "MemAvailable:", 1024);
    r.rss_anon = field_from("/proc/self/status", "RssAnon:", 1024);
    r.rss_file = field_from("/proc/self/status", "RssFile:", 1024);
    r.pressure_some_avg10 = pressure_avg10();
    std::ifstream f("/proc/self/cgroup");
    std::string line;
    while (std::getline(f, line)) {  // "<id>:<controllers>:<path>"
        const size_t a = line.find(':');
        const size_t b = line.find(':', a + 1);
        if (a == std::string::npos || b == std::string::npos) {
            continue;
        }
        const std::string controllers = line.substr(a + 1, b - a - 1);
        const std::string path = line.substr(b + 1);
        if (controllers.empty() && line.compare(0, a, "0") == 0) {
            const bool unified = std::ifstream("/sys/fs/cgroup/cgroup.controllers").good();
            cgroup_limits(unified ? "/sys/fs/cgroup" : "/sys/fs/cgroup/unified", path, "cgroup v2", "memory.max",
                          "memory.current", "inactive_file", r.cgroups);
        } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
            cgroup_limits("/sys/fs/cgroup/memory", path, "cgroup v1", "memory.limit_in_bytes", "memory.usage_in_bytes",
                          "total_inactive_file", r.cgroups);
        }
    }
    return r;
}

uint64_t mappings_left() {
    std::ifstream limit_file("/proc/sys/vm/max_map_count");
    uint64_t limit = 0;
    if (!(limit_file >> limit)) {
        return UINT64_MAX;
    }
    std::ifstream maps("/proc/self/maps");
    uint64_t used = 0;
    for (std::string line; std::getline(maps, line);) {
        ++used;
    }
    constexpr uint64_t kReserve = 4096;
    return limit > used + kReserve ? limit - used - kReserve : 0;
}

uint64_t resident_bytes_of(const void * data, uint64_t size) {
    const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const auto start = reinterpret_cast<uintptr_t>(data) / page * page;
    const auto end = (reinterpret_cast<uintptr_t>(data) + size + page - 1) / page * page;
    if (size == 0 || end <= start) {
        return 0;
    }
    std::vector<unsigned char> vec((end - start) / page);
    if (mincore(reinterpret_cast<void *>(start), end - start, vec.data()) != 0) {
        return size;  // not a mapping we can ask about: assume it is all there
    }
    uint64_t pages = 0;
    for (unsigned char v : vec) {
        pages += v & 1;
    }
    return std::min(size, pages * page);
}

DroppedPages drop_mapped_pages(void * data, uint64_t bytes) {
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const auto start = reinterpret_cast<uintptr_t>(data);
    const uintptr_t first = (start + page - 1) / page * page;
    const uintptr_t last = (start + bytes) / page * page;
    if (last <= first) {
        return {};
    }
    madvise(reinterpret_cast<void *>(first), last - first, MADV_DONTNEED);
    return {first - start, last - first};
}

std::vector<FileMapping> file_mappings(const std::string & path) {
    struct stat st {};
    std::vector<FileMapping> out;
    if (stat(path.c_str(), &st) != 0) {
        return out;
    }
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);) {
        // start-end perms offset major:minor inode [path]
        unsigned long long start = 0, end = 0, offset = 0, inode = 0;
        unsigned major = 0, minor = 0;
        char perms[8] = {};
        if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %x:%x %llu", &start, &end, perms, &offset, &major, &minor,
                        &inode) == 7 &&
            inode == st.st_ino && makedev(major, minor) == st.st_dev && end > start) {
            out.push_back({reinterpret_cast<void *>(start), end - start, offset});
        }
    }
    return out;
}

}  // namespace bmoe::detail
