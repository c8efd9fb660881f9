// How much memory the expert cache may hold, decided from what is really there: the tightest of
// every memory cgroup limit this process is in (a container, a systemd MemoryMax=, a benchmark's
// cap) and the machine's available memory, less what the process already holds and what it will
// still touch (KV cache and compute buffers that are allocated but not yet written, dense weights
// not yet in memory), less one or two layers' experts in flight and a margin. Measured at open
// and again while running, so the cache gives memory back under pressure and takes it again when
// the pressure goes. BudgetPolicy decides; MemoryBudget only feeds it the readings (telemetry), and
// the evictions are the streamer's.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bmoe/config.h"
#include "core/telemetry.h"

namespace bmoe::detail {

struct Region {
    const void * data = nullptr;
    uint64_t size = 0;
};

struct Footprint {
    std::vector<Region> to_touch;  // the KV cache and (dense=mmap) dense weights
    std::vector<Region> drafter;   // an in-file MTP head's dense weights (dense=mmap): to touch while it is awake
    // The compute buffers: sized for the largest batch (a prompt's ubatch), written by a prompt and
    // by little else; a decode touches a small part of them.
    std::vector<Region> scratch;
    // A batch of many tokens routes to more of a layer's experts than a decode: the layer computed and the
    // one being read hold that many until the next layer evicts them. The widest layer's bytes per expert
    // and the routing's counts size it.
    uint64_t expert_bytes_widest = 0;
    int n_expert = 0;
    int n_expert_used = 0;
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

// The policy, a pure function of its inputs: readings, the bytes still to touch and the time come
// in, a budget goes out. Nothing here reads memory or the clock (tests/test_policies.py drives it).
class BudgetPolicy {
public:
    using Clock = std::chrono::steady_clock;
    // Read memory at most this often while running: a reading is a handful of small file reads.
    static constexpr auto kCheckEvery = std::chrono::milliseconds(250);
    // After pressure, wait this long before growing again, so the cache does not chase a neighbour.
    static constexpr auto kCalmBeforeGrowing = std::chrono::seconds(2);
    // Signs of pressure: the machine stalls on memory (PSI "some", percent over 10 s), or dense
    // weights are being read back from disk (major faults in one step).
    static constexpr double kPressureAvg10 = 20.0;
    static constexpr uint64_t kPressureMajorFaults = 256;

    // `in_flight_bytes` and `mappings_cap_bytes` as in Footprint; `slot_bytes`: one expert of every
    // layer, the smallest budget that can hit.
    BudgetPolicy(const StreamConfig & config, uint64_t in_flight_bytes, uint64_t mappings_cap_bytes, uint64_t slot_bytes);

    // The budget at open, with `pending` bytes the process will still touch. Throws bmoe::Error when
    // a limit cannot hold the model even without a cache (the message says how much it needs).
    BudgetReport initial(const MemoryReading & reading, uint64_t pending, Clock::time_point now);
    // Whether adapt would look at a reading taken `now` (at most every kCheckEvery, and only when
    // the budget adapts at all): the caller reads memory only then.
    bool due(Clock::time_point now) const { return adaptive_ && now - last_check_ >= kCheckEvery; }
    // The budget the cache should have now, given a reading, the pool memory the cache holds and
    // this step's major faults; `current` when nothing should change (or when not due).
    uint64_t adapt(uint64_t current, uint64_t pool_held, uint64_t step_major_faults, const MemoryReading & reading,
                   uint64_t pending, Clock::time_point now);

    // The budget the memory affords now, without adapt's hysteresis or its wait: for the engine's
    // own foreseen moves (a prompt's compute buffers about to be written, or just given back), which
    // are not pressure. `current` where the budget does not adapt (the cache is off).
    uint64_t rebase(uint64_t current, uint64_t pool_held, const MemoryReading & reading, uint64_t pending,
                    Clock::time_point now);
    // After memory given back outside the cache (`before`/`pending_before`: the readings just before it):
    // `current` grown by what the two readings show was given back, at once, up to the cap, and never
    // below rebase's fresh look. Not the fresh look alone: the drift since open (page tables, the
    // allocator's arenas: 2.3 MiB by decode 16 on the 24-layer fixture) is adapt's to judge with its
    // noise band, as in a run that gives nothing back; a fresh look had charged it to the drafter.
    uint64_t after_release(uint64_t current, uint64_t pool_held, const MemoryReading & before, uint64_t pending_before,
                           const MemoryReading & after, uint64_t pending_after, Clock::time_point now);

    bool adaptive() const { return adaptive_; }

    // What a prompt may write in compute buffers with the cache emptied: the headroom less the bytes still to
    // touch besides them (`pending`), the experts in flight and the margin. Negative when nothing is left.
    int64_t prompt_room(const MemoryReading & reading, uint64_t pool_held, uint64_t pending) const;
    // The physical batch (ubatch) a prompt is decoded in: the context's `ubatch` where its compute buffers
    // (`scratch` bytes still to write for `ubatch` tokens) fit `room`, else the largest multiple of
    // kUbatchStep whose share of them does (they grow about linearly with the tokens: activations per
    // token, and without flash attention the KQ scores, n_ctx x n_head floats per token), never below
    // kUbatchStep (or `ubatch` where that is smaller). Fewer ubatches read a prompt's routed experts fewer
    // times: each ubatch of a long prompt routes to nearly every expert of every layer.
    static constexpr int kUbatchStep = 64;
    static int affordable_ubatch(int ubatch, uint64_t scratch, int64_t room);

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

    StreamConfig config_;
    uint64_t in_flight_bytes_;
    uint64_t mappings_cap_bytes_;
    uint64_t slot_bytes_;
    uint64_t cap_ = 0;  // the most the cache may grow to: the fixed request, or auto's ceiling
    bool adaptive_ = false;
    Clock::time_point last_check_{};
    Clock::time_point calm_since_{};
};

// The mechanism around it: reads memory (telemetry), what of the footprint is not yet resident
// (mincore) and the clock, and asks the policy.
class MemoryBudget {
public:
    MemoryBudget(const StreamConfig & config, Footprint footprint, uint64_t slot_bytes);

    BudgetReport initial(const MemoryReading & reading);
    // While running (call once per token; it reads memory at most every few hundred ms).
    uint64_t adapt(uint64_t current, uint64_t pool_held, uint64_t step_major_faults);
    // Around a prompt of `n_tokens` (a batch of more than one token, physical batch `ubatch`): before,
    // the budget leaves room for the share of the compute buffers such a batch writes (at open they
    // are counted whole); after, the compute buffers' pages the last graph ran in (`scratch`, the
    // seam's) are given back to the kernel and the budget takes them at once. A prompt's ubatch of
    // 512 tokens wrote ~200 MiB there on the 3 GB preset that the decodes after it never touch again.
    uint64_t before_prompt(uint64_t current, uint64_t pool_held, int n_tokens, int ubatch);
    uint64_t after_prompt(uint64_t current, uint64_t pool_held, const std::vector<Region> & scratch);
    // At open, before initial: the ubatch a prompt can afford under the memory limit now (affordable_ubatch);
    // the compute buffers are counted from then on as that ubatch's share of them.
    int fit_prompt_ubatch(int ubatch, uint64_t pool_held);
    // Memory this process gives back outside the cache (a drafter put to sleep: its pages, an in-file
    // head's context): `release` runs between two readings, and the budget takes what it gave back at
    // once (adapt's hysteresis would leave less than a token's experts unused: measured, a 23 MiB
    // assistant beside a 294 MiB budget whose step is 40 MiB). BudgetPolicy::after_release says how much.
    uint64_t after_release(uint64_t current, uint64_t pool_held, const std::function<void()> & release);
    // An awake drafter's pages (Footprint::drafter) not in memory are memory still to come; an asleep
    // one's are not.
    void set_drafter_asleep(bool asleep) { drafter_asleep_ = asleep; }
    // Bytes given back by the last after_prompt.
    uint64_t released_bytes() const { return released_; }

    bool adaptive() const { return policy_.adaptive(); }

private:
    uint64_t pending() const;
    uint64_t untouched(const std::vector<Region> & regions) const;
    // Two layers of a prompt's experts beyond a decode's (before_prompt says why).
    uint64_t wide_bytes(int n_tokens, int ubatch) const;

    Footprint footprint_;
    BudgetPolicy policy_;
    double scratch_share_ = 1.0;  // of the compute buffers' untouched bytes, what the next graph may write
    bool drafter_asleep_ = false;
    uint64_t released_ = 0;
};

std::string mib(uint64_t bytes);

}  // namespace bmoe::detail
