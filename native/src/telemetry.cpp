#include "telemetry.h"

#include <sys/resource.h>
#include <unistd.h>

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

uint64_t mem_available_bytes() { return field_from("/proc/meminfo", "MemAvailable:", 1024); }

}  // namespace bmoe::detail
