// How much memory the expert cache may hold, decided from what is really there: the tightest of
// every memory cgroup limit this process is in (a container, a systemd MemoryMax=, a benchmark's
// cap) and the machine's available memory, less what the process already holds and what it will
// still touch (KV cache and compute buffers that are allocated but not yet written, dense weights
// not yet in memory), less one or two layers' experts in flight and a margin. Measured at open
// and again while running, so the cache gives memory back under pressure and takes it again when
// the pressure goes. Policy only: the readings come from telemetry, the evictions from the streamer.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bmoe/config.h"
#include "telemetry.h"

namespace bmoe::detail {

struct Region {
    const void * data = nullptr;
    uint64_t size = 0;
};

struct Footprint {
    std::vector<Region> to_touch;  // runtime buffers and (dense=mmap) dense weights
    uint64_t in_flight_bytes = 0;  // experts resident beyond the cache: the layer computed and the next
    uint64_t mappings_cap_bytes = UINT64_MAX;  // the most the cache can map under vm.max_map_count
};

struct BudgetReport {
    uint64_t budget = 0;
    std::string limit_source;   // "cgroup v1 /a/b", "machine"
    uint64_t limit = 0;         // bytes of that limit
    uint64_t headroom = 0;      // what the cache could take at open
    uint64_t pending = 0;       // bytes the process will still touch
    std::string note;           // why the budget is what it is (clamped, cannot hit, ...)
};

class MemoryBudget {
public:
    // `slot_bytes`: one expert of every layer, the smallest budget that can hit.
    MemoryBudget(const StreamConfig & config, Footprint footprint, uint64_t slot_bytes);

    // The budget at open. Throws bmoe::Error when a limit cannot hold the model even without a
    // cache (the message says how much it needs).
    BudgetReport initial(const MemoryReading & reading);
    // While running (call once per token; it reads memory at most every few hundred ms): the
    // budget the cache should have now, given the pool memory it holds and this step's major faults.
    // Returns `current` when nothing should change.
    uint64_t adapt(uint64_t current, uint64_t pool_held, uint64_t step_major_faults);

    bool adaptive() const { return adaptive_; }

    // What a cgroup could still give this process: its limit less its usage, plus the page cache the
    // kernel takes back first (never our own mapped dense weights). Negative when it is over.
    static int64_t cgroup_free(const CgroupMemory & c, const MemoryReading & reading);

private:
    struct Headroom {
        int64_t bytes = 0;
        std::string source;
        uint64_t limit = 0;
    };
    Headroom headroom(const MemoryReading & reading, uint64_t pool_held) const;
    uint64_t pending() const;

    StreamConfig config_;
    Footprint footprint_;
    uint64_t slot_bytes_;
    uint64_t cap_ = 0;  // the most the cache may grow to: the fixed request, or auto's ceiling
    bool adaptive_ = false;
    std::chrono::steady_clock::time_point last_check_{};
    std::chrono::steady_clock::time_point calm_since_{};
};

std::string mib(uint64_t bytes);

}  // namespace bmoe::detail
