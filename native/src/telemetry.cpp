#include "telemetry.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>

namespace bmoe::detail {
namespace {

uint64_t field_from(const char * path, const std::string & key, uint64_t scale) {
    std::ifstream f(path);
    std::string k;
    uint64_t v = 0;
    while (f >> k >> v) {
        if (k == key) {
            return v * scale;
        }
        f.ignore(256, '\n');
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

uint64_t cgroup_headroom(const std::string & base, const std::string & path, const char * limit_name,
                         const char * usage_name) {
    uint64_t headroom = UINT64_MAX;
    for (std::string p = path;;) {
        const std::string dir = base + (p == "/" ? "" : p);
        const uint64_t limit = cgroup_value(dir + "/" + limit_name);
        const uint64_t usage = cgroup_value(dir + "/" + usage_name);
        if (limit < (1ULL << 60) && usage != UINT64_MAX) {  // v1 reports "no limit" as ~2^63
            headroom = std::min(headroom, limit > usage ? limit - usage : 0);
        }
        if (p.empty() || p == "/") {
            return headroom;
        }
        const size_t slash = p.rfind('/');
        p = slash == 0 || slash == std::string::npos ? "/" : p.substr(0, slash);
    }
}

}  // namespace

uint64_t mem_available_bytes() {
    uint64_t available = field_from("/proc/meminfo", "MemAvailable:", 1024);
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
            available = std::min(available, cgroup_headroom(unified ? "/sys/fs/cgroup" : "/sys/fs/cgroup/unified", path,
                                                            "memory.max", "memory.current"));
        } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
            available = std::min(available, cgroup_headroom("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes",
                                                            "memory.usage_in_bytes"));
        }
    }
    return available;
}

}  // namespace bmoe::detail
