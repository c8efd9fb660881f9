#include "policy/memory_budget.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "bmoe/error.h"

namespace bmoe::detail {
namespace {

constexpr uint64_t kMiB = 1ULL << 20;

int64_t to_signed(uint64_t v) { return static_cast<int64_t>(std::min<uint64_t>(v, INT64_MAX)); }

}  // namespace

std::string mib(uint64_t bytes) {
    char buf[32];
    const double m = static_cast<double>(bytes) / static_cast<double>(kMiB);
    if (bytes < kMiB) {
        std::snprintf(buf, sizeof(buf), "%.0f KiB", static_cast<double>(bytes) / 1024.0);
    } else {
        std::snprintf(buf, sizeof(buf), m < 10 ? "%.1f MiB" : "%.0f MiB", m);
    }
    return buf;
}

BudgetPolicy::BudgetPolicy(const StreamConfig & config, uint64_t in_flight_bytes, uint64_t mappings_cap_bytes,
                           uint64_t slot_bytes)
    : config_(config), in_flight_bytes_(in_flight_bytes), mappings_cap_bytes_(mappings_cap_bytes), slot_bytes_(slot_bytes) {}

// What a cgroup could still give: its limit less its usage, plus the page cache the kernel takes
// back first — never counting our own mapped file pages (dense weights) as reclaimable.
int64_t BudgetPolicy::cgroup_free(const CgroupMemory & c, const MemoryReading & m) {
    const uint64_t reclaimable = c.inactive_file > m.rss_file ? c.inactive_file - m.rss_file : 0;
    return to_signed(c.limit) - to_signed(c.usage) + to_signed(reclaimable);
}

BudgetPolicy::Headroom BudgetPolicy::headroom(const MemoryReading & m, uint64_t pool_held) const {
    // The pool's pages are the cache's own (charged as shared memory, never counted as available).
    // Mapped file pages of ours (dense weights) may sit on the inactive list: never count them as
    // memory the kernel could take back for the cache.
    Headroom best;
    const uint64_t floor = static_cast<uint64_t>(config_.cache_floor_mb) * kMiB;
    best.bytes = to_signed(m.mem_available + pool_held) - to_signed(m.rss_file) - to_signed(floor);
    best.source = "machine";
    best.limit = m.mem_total;
    for (const CgroupMemory & c : m.cgroups) {
        const int64_t free = cgroup_free(c, m) + to_signed(pool_held);
        if (free < best.bytes) {
            best = {free, c.path, c.limit};
        }
    }
    return best;
}

BudgetReport BudgetPolicy::initial(const MemoryReading & m, uint64_t pending, Clock::time_point now) {
    BudgetReport report;
    report.pending = pending;
    const uint64_t need = report.pending + in_flight_bytes_;
    // A hard limit that cannot hold the model with no cache at all: say so before decoding.
    for (const CgroupMemory & c : m.cgroups) {
        const uint64_t reclaimable = c.inactive_file > m.rss_file ? c.inactive_file - m.rss_file : 0;
        if (cgroup_free(c, m) < to_signed(need)) {
            throw Error("the memory limit of " + c.path + " (" + mib(c.limit) + ") is too small for this model: it needs " +
                        mib(c.usage - reclaimable + need) + " with no expert cache (" + mib(c.usage - reclaimable) +
                        " in use, " + mib(report.pending) + " of KV cache, compute buffers and dense weights still to touch, " +
                        mib(in_flight_bytes_) + " of experts in flight); raise the limit or lower --ctx/--batch");
        }
    }
    if (m.mem_total > 0 && m.rss_anon + m.rss_file + need > m.mem_total) {
        throw Error("this machine's memory (" + mib(m.mem_total) + ") is too small for this model: it needs " +
                    mib(m.rss_anon + m.rss_file + need) + " with no expert cache; lower --ctx/--batch");
    }
    const Headroom h = headroom(m, 0);
    report.limit_source = h.source;
    report.limit = h.limit;
    const int64_t margin = config_.cache_margin_mb * static_cast<int64_t>(kMiB);
    const int64_t left = h.bytes - to_signed(need) - margin;
    report.headroom = left > 0 ? static_cast<uint64_t>(left) : 0;
    const uint64_t ceiling = static_cast<uint64_t>(config_.cache_ceil_mb) * kMiB;
    if (config_.cache_mb == kAuto) {
        cap_ = ceiling;
        report.budget = std::min(report.headroom, ceiling);
    } else {
        cap_ = static_cast<uint64_t>(config_.cache_mb * static_cast<double>(kMiB));
        report.budget = std::min(report.headroom, cap_);
        if (cap_ > report.headroom) {
            report.note = "cache budget " + mib(cap_) + " is more than the memory left (" + mib(report.headroom) +
                          " under the " + h.source + " limit): clamped to " + mib(report.budget);
        }
    }
    if (cap_ > mappings_cap_bytes_) {
        cap_ = mappings_cap_bytes_;
        if (report.budget > cap_) {
            report.budget = cap_;
            report.note += std::string(report.note.empty() ? "" : "; ") + "cache budget limited to " + mib(cap_) +
                           " by vm.max_map_count (each cached slice is a mapping; raise it with sysctl or use a "
                           "larger --page-kb)";
        }
    }
    adaptive_ = cap_ > 0;
    if (report.budget > 0 && report.budget < slot_bytes_) {
        report.note += std::string(report.note.empty() ? "" : "; ") + "cache budget " + mib(report.budget) +
                       " cannot hold one expert of every layer (" + mib(slot_bytes_) + "), so it could never hit: running "
                       "with the cache off";
    }
    last_check_ = calm_since_ = now;
    return report;
}

uint64_t BudgetPolicy::adapt(uint64_t current, uint64_t pool_held, uint64_t step_major_faults, const MemoryReading & m,
                             uint64_t pending, Clock::time_point now) {
    if (!due(now)) {
        return current;
    }
    last_check_ = now;
    const int64_t margin = config_.cache_margin_mb * static_cast<int64_t>(kMiB);
    const int64_t left = headroom(m, pool_held).bytes - to_signed(pending + in_flight_bytes_) - margin;
    uint64_t target = std::min(left > 0 ? static_cast<uint64_t>(left) : 0, cap_);
    // Small moves either way are noise (the margin absorbs them); pressure always shrinks.
    const uint64_t step = std::max(slot_bytes_, current / 16);
    if (m.pressure_some_avg10 > kPressureAvg10 || step_major_faults > kPressureMajorFaults) {
        target = std::min(target, current - current / 4);
    } else if (target < current && target + step / 2 >= current) {
        return current;
    }
    if (target < current) {
        calm_since_ = now;
        return target;
    }
    if (target > current + step && now - calm_since_ >= kCalmBeforeGrowing) {
        return target;
    }
    return current;
}

int64_t BudgetPolicy::prompt_room(const MemoryReading & m, uint64_t pool_held, uint64_t pending) const {
    const int64_t margin = config_.cache_margin_mb * static_cast<int64_t>(kMiB);
    return headroom(m, pool_held).bytes - to_signed(pending + in_flight_bytes_) - margin;
}

uint64_t BudgetPolicy::rebase(uint64_t current, uint64_t pool_held, const MemoryReading & m, uint64_t pending,
                              Clock::time_point now) {
    if (!adaptive_) {
        return current;
    }
    last_check_ = now;
    const int64_t left = prompt_room(m, pool_held, pending);
    return std::min(left > 0 ? static_cast<uint64_t>(left) : 0, cap_);
}

uint64_t BudgetPolicy::after_release(uint64_t current, uint64_t pool_held, const MemoryReading & before,
                                     uint64_t pending_before, const MemoryReading & after, uint64_t pending_after,
                                     Clock::time_point now) {
    const uint64_t fresh = rebase(current, pool_held, after, pending_after, now);
    if (!adaptive_) {
        return fresh;
    }
    const int64_t given = prompt_room(after, pool_held, pending_after) - prompt_room(before, pool_held, pending_before);
    const uint64_t grown = given > 0 ? std::min(current + static_cast<uint64_t>(given), cap_) : current;
    return std::max(fresh, grown);
}

int BudgetPolicy::affordable_ubatch(int ubatch, uint64_t scratch, int64_t room) {
    if (ubatch <= kUbatchStep || to_signed(scratch) <= room) {
        return ubatch;
    }
    const double per_token = static_cast<double>(scratch) / static_cast<double>(ubatch);
    const auto fits = static_cast<int64_t>(static_cast<double>(std::max<int64_t>(room, 0)) / per_token);
    const int64_t stepped = fits / kUbatchStep * kUbatchStep;
    return static_cast<int>(std::clamp<int64_t>(stepped, kUbatchStep, ubatch));
}

MemoryBudget::MemoryBudget(const StreamConfig & config, Footprint footprint, uint64_t slot_bytes)
    : footprint_(std::move(footprint)),
      policy_(config, footprint_.in_flight_bytes, footprint_.mappings_cap_bytes, slot_bytes) {}

uint64_t MemoryBudget::untouched(const std::vector<Region> & regions) const {
    uint64_t total = 0;
    for (const Region & r : regions) {
        total += r.size - std::min(r.size, resident_bytes_of(r.data, r.size));
    }
    return total;
}

uint64_t MemoryBudget::pending() const {
    return untouched(footprint_.to_touch) + (drafter_asleep_ ? 0 : untouched(footprint_.drafter)) +
           static_cast<uint64_t>(scratch_share_ * static_cast<double>(untouched(footprint_.scratch)));
}

uint64_t MemoryBudget::wide_bytes(int n_tokens, int ubatch) const {
    const int64_t routed = std::min<int64_t>(footprint_.n_expert,
                                             static_cast<int64_t>(std::min(n_tokens, ubatch)) * footprint_.n_expert_used);
    return routed > footprint_.n_expert_used
               ? 2 * footprint_.expert_bytes_widest * static_cast<uint64_t>(routed - footprint_.n_expert_used)
               : 0;
}

int MemoryBudget::fit_prompt_ubatch(int ubatch, uint64_t pool_held) {
    const uint64_t others = untouched(footprint_.to_touch) + wide_bytes(ubatch, ubatch);
    const int fitted = BudgetPolicy::affordable_ubatch(ubatch, untouched(footprint_.scratch),
                                                       policy_.prompt_room(read_memory(), pool_held, others));
    scratch_share_ = static_cast<double>(fitted) / static_cast<double>(std::max(1, ubatch));
    return fitted;
}

uint64_t MemoryBudget::before_prompt(uint64_t current, uint64_t pool_held, int n_tokens, int ubatch) {
    // The graph's buffers grow about with its tokens (activations per token, attention scores per
    // token and position): a share of the whole, never more.
    scratch_share_ = std::min(1.0, static_cast<double>(n_tokens) / static_cast<double>(std::max(1, ubatch)));
    // Two layers' experts beyond a decode's (the in-flight allowance counts a decode's): measured on the 3 GB
    // preset, a 2,048-token prompt in 4 ubatches without this room sat at its cgroup limit (5 million limit
    // hits) and the decodes after it re-read dense pages at 0.25x the speed.
    const uint64_t target = policy_.rebase(current, pool_held, read_memory(), pending() + wide_bytes(n_tokens, ubatch),
                                           BudgetPolicy::Clock::now());
    return std::min(current, target);
}

uint64_t MemoryBudget::after_prompt(uint64_t current, uint64_t pool_held, const std::vector<Region> & scratch) {
    // The pages of a compute buffer hold nothing the next graph reads before writing it: give them
    // back (whole pages inside the buffer only: the allocator's own header sits before its first byte).
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    released_ = 0;
    for (const Region & r : scratch) {
        const auto begin = reinterpret_cast<uintptr_t>(r.data);
        const uintptr_t first = (begin + page - 1) / page * page;
        const uintptr_t last = (begin + r.size) / page * page;
        if (last > first) {
            const uint64_t held = resident_bytes_of(reinterpret_cast<const void *>(first), last - first);
            if (madvise(reinterpret_cast<void *>(first), last - first, MADV_DONTNEED) == 0) {
                released_ += held;
            }
        }
    }
    scratch_share_ = 0;  // what decodes touch of them is resident after the first and counted as used
    return policy_.rebase(current, pool_held, read_memory(), pending(), BudgetPolicy::Clock::now());
}

uint64_t MemoryBudget::after_release(uint64_t current, uint64_t pool_held, const std::function<void()> & release) {
    const MemoryReading before = read_memory();
    const uint64_t pending_before = pending();
    release();
    return policy_.after_release(current, pool_held, before, pending_before, read_memory(), pending(),
                                 BudgetPolicy::Clock::now());
}

BudgetReport MemoryBudget::initial(const MemoryReading & reading) {
    return policy_.initial(reading, pending(), BudgetPolicy::Clock::now());
}

uint64_t MemoryBudget::adapt(uint64_t current, uint64_t pool_held, uint64_t step_major_faults) {
    const auto now = BudgetPolicy::Clock::now();
    if (!policy_.due(now)) {  // the readings cost a few file reads and a mincore walk: only when due
        return current;
    }
    return policy_.adapt(current, pool_held, step_major_faults, read_memory(), pending(), now);
}

}  // namespace bmoe::detail
