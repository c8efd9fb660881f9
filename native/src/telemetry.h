// Readings of this process and machine for the telemetry (Linux /proc and getrusage).
#pragma once

#include <cstdint>

namespace bmoe::detail {

uint64_t rss_bytes();
uint64_t major_faults();
uint64_t storage_read_bytes();  // /proc/self/io read_bytes: what really came from the device
// MemAvailable, further limited by the headroom (limit - usage) of every memory cgroup (v1 or v2)
// this process sits in, ancestors included: a container or a benchmark's RAM cap counts.
uint64_t mem_available_bytes();

}  // namespace bmoe::detail
