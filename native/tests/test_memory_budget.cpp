// BudgetPolicy (memory_budget.h, docs/memory.md): the budget at open is the tightest headroom (a
// cgroup's limit less its usage and our share of its page cache, or the machine's MemAvailable less
// cache_floor_mb) less what the process will still touch, the experts in flight and
// cache_margin_mb, at most auto's ceiling or the fixed request; while running it reads memory at
// most every 250 ms, takes a quarter off under pressure (PSI some avg10 > 20%, > 256 major faults in
// a step), follows a lower target at once unless the move is noise, and grows back only 2 s after
// the last shrink, up to its cap; after memory the engine gave back (a drafter asleep) it grows at
// once by what was given back.
#include <chrono>
#include <cstdint>
#include <string>

#include "check.h"
#include "policy/memory_budget.h"

using bmoe::StreamConfig;
using bmoe::detail::BudgetPolicy;
using bmoe::detail::BudgetReport;
using bmoe::detail::CgroupMemory;
using bmoe::detail::MemoryReading;

namespace {

constexpr uint64_t MiB = 1ull << 20;
using Time = BudgetPolicy::Clock::time_point;
using std::chrono::milliseconds;

const Time t0 = Time{} + std::chrono::hours(1);

StreamConfig config(double cache_mb = static_cast<double>(bmoe::kAuto)) {
    StreamConfig c;
    c.cache_mb = cache_mb;
    c.cache_floor_mb = 1024;
    c.cache_margin_mb = 64;
    c.cache_ceil_mb = 1 << 20;
    return c;
}

// A machine with 4096 MiB available of 8192, 500 MiB anonymous and 100 MiB of mapped dense weights.
MemoryReading machine() {
    MemoryReading m;
    m.mem_total = 8192 * MiB;
    m.mem_available = 4096 * MiB;
    m.rss_anon = 500 * MiB;
    m.rss_file = 100 * MiB;
    return m;
}

// Only a cgroup limits: `limit` MiB with `usage` MiB charged, nothing of ours mapped from files.
MemoryReading cgroup(uint64_t limit, uint64_t usage) {
    MemoryReading m;
    m.mem_total = 64 * 1024 * MiB;
    m.mem_available = 60 * 1024 * MiB;
    m.cgroups.push_back({"cgroup v2 /bmoe", limit * MiB, usage * MiB, 0});
    return m;
}

// 200 MiB still to touch, 50 MiB of experts in flight, one expert of every layer 10 MiB.
BudgetPolicy policy(const StreamConfig & c, uint64_t mappings_cap = UINT64_MAX) {
    return BudgetPolicy(c, 50 * MiB, mappings_cap, 10 * MiB);
}
constexpr uint64_t kPending = 200 * MiB;

}  // namespace

POLICY_TEST(budget_under_the_machine_limit_leaves_the_floor_to_others) {
    BudgetPolicy p = policy(config());
    const BudgetReport r = p.initial(machine(), kPending, t0);
    // 4096 available - 100 of our own dense weights - 1024 floor - 200 pending - 50 in flight - 64 margin
    CHECK_EQ(r.budget, 2658 * MiB);
    CHECK_EQ(r.headroom, 2658 * MiB);
    CHECK_EQ(r.pending, kPending);
    CHECK_EQ(r.limit_source, std::string("machine"));
    CHECK_EQ(r.limit, 8192 * MiB);
    CHECK_EQ(r.note, std::string());
    CHECK(p.adaptive());
}

POLICY_TEST(budget_under_a_cgroup_limit_the_tightest_limit_wins_and_no_floor) {
    MemoryReading m = machine();
    // 1000 limit - 300 used + 50 of its page cache (150 inactive, 100 of it our own dense weights)
    m.cgroups.push_back({"cgroup v2 /", 4000 * MiB, 1000 * MiB, 0});  // a looser ancestor
    m.cgroups.push_back({"cgroup v2 /bmoe", 1000 * MiB, 300 * MiB, 150 * MiB});
    const BudgetReport r = policy(config()).initial(m, kPending, t0);
    CHECK_EQ(r.budget, (750 - 250 - 64) * MiB);
    CHECK_EQ(r.limit_source, std::string("cgroup v2 /bmoe"));
    CHECK_EQ(r.limit, 1000 * MiB);
    // Our own mapped pages are never counted as page cache the kernel could take back.
    m.cgroups.back().inactive_file = 80 * MiB;
    CHECK_EQ(policy(config()).initial(m, kPending, t0).budget, (700 - 250 - 64) * MiB);
    CHECK_EQ(BudgetPolicy::cgroup_free(m.cgroups.back(), m), static_cast<int64_t>(700 * MiB));
}

POLICY_TEST(budget_fixed_request_is_clamped_to_the_headroom_with_a_note) {
    const MemoryReading m = cgroup(1064, 300);  // 1064 - 300 - 250 - 64 = 450 MiB of headroom
    BudgetReport r = policy(config(300)).initial(m, kPending, t0);
    CHECK_EQ(r.budget, 300 * MiB);
    CHECK_EQ(r.headroom, 450 * MiB);
    CHECK_EQ(r.note, std::string());
    r = policy(config(1000)).initial(m, kPending, t0);
    CHECK_EQ(r.budget, 450 * MiB);
    CHECK(r.note.find("1000 MiB is more than the memory left (450 MiB") != std::string::npos);
    CHECK(r.note.find("clamped to 450 MiB") != std::string::npos);
    CHECK_EQ(policy(config(0.5)).initial(m, kPending, t0).budget, MiB / 2);  // fractions of a MiB
}

POLICY_TEST(budget_auto_ceiling_and_the_mappings_cap) {
    const MemoryReading m = cgroup(1064, 300);  // 450 MiB of headroom
    StreamConfig c = config();
    c.cache_ceil_mb = 100;
    CHECK_EQ(policy(c).initial(m, kPending, t0).budget, 100 * MiB);
    const BudgetReport r = policy(config(), 200 * MiB).initial(m, kPending, t0);
    CHECK_EQ(r.budget, 200 * MiB);
    CHECK(r.note.find("vm.max_map_count") != std::string::npos);
    CHECK_EQ(policy(config(), 600 * MiB).initial(m, kPending, t0).note, std::string());  // not the limit
}

POLICY_TEST(budget_below_one_expert_of_every_layer_says_it_cannot_hit) {
    const BudgetReport r = policy(config(5)).initial(cgroup(1064, 300), kPending, t0);
    CHECK_EQ(r.budget, 5 * MiB);
    CHECK(r.note.find("cannot hold one expert of every layer (10 MiB)") != std::string::npos);
    CHECK(r.note.find("cache off") != std::string::npos);
}

POLICY_TEST(budget_a_limit_too_small_for_the_model_is_an_error_with_the_numbers) {
    // 400 - 300 used leaves 100 MiB; it needs 200 pending + 50 in flight.
    CHECK_THROWS(policy(config()).initial(cgroup(400, 300), kPending, t0),
                 "the memory limit of cgroup v2 /bmoe (400 MiB) is too small for this model: it needs 550 MiB");
    MemoryReading m = machine();
    m.mem_total = 800 * MiB;  // 500 + 100 held + 250 needed
    CHECK_THROWS(policy(config()).initial(m, kPending, t0), "this machine's memory (800 MiB) is too small for this model: it needs 850 MiB");
    // Even with the cache off: the model itself does not fit.
    CHECK_THROWS(policy(config(0)).initial(cgroup(400, 300), kPending, t0), "too small");
}

POLICY_TEST(budget_cache_off_does_not_adapt) {
    BudgetPolicy p = policy(config(0));
    CHECK_EQ(p.initial(cgroup(4000, 0), kPending, t0).budget, 0ull);
    CHECK(!p.adaptive());
    CHECK(!p.due(t0 + std::chrono::seconds(10)));
    MemoryReading pressed = cgroup(4000, 0);
    pressed.pressure_some_avg10 = 90;
    CHECK_EQ(p.adapt(0, 0, 1000, pressed, kPending, t0 + std::chrono::seconds(10)), 0ull);
}

POLICY_TEST(budget_adapts_at_most_every_250_ms) {
    BudgetPolicy p = policy(config());
    const uint64_t budget = p.initial(cgroup(2314, 0), kPending, t0).budget;  // 2314 - 250 - 64
    CHECK_EQ(budget, 2000 * MiB);
    MemoryReading pressed = cgroup(2314, 0);
    pressed.pressure_some_avg10 = 50;
    CHECK(!p.due(t0 + milliseconds(249)));
    CHECK_EQ(p.adapt(budget, 0, 0, pressed, kPending, t0 + milliseconds(249)), budget);
    CHECK(p.due(t0 + milliseconds(250)));
    CHECK_EQ(p.adapt(budget, 0, 0, pressed, kPending, t0 + milliseconds(250)), 1500 * MiB);
    CHECK_EQ(p.adapt(1500 * MiB, 0, 0, pressed, kPending, t0 + milliseconds(400)), 1500 * MiB);  // 150 ms later
}

POLICY_TEST(budget_pressure_takes_a_quarter_off) {
    const MemoryReading m = cgroup(2314, 0);  // a target of 2000 MiB
    auto after = [&](const MemoryReading & reading, uint64_t faults) {
        BudgetPolicy p = policy(config());
        p.initial(m, kPending, t0);
        return p.adapt(1600 * MiB, 0, faults, reading, kPending, t0 + std::chrono::seconds(1));
    };
    MemoryReading psi = m;
    psi.pressure_some_avg10 = 20.5;
    CHECK_EQ(after(psi, 0), 1200 * MiB);
    psi.pressure_some_avg10 = 20.0;  // not above 20%
    CHECK_EQ(after(psi, 0), 1600 * MiB);
    CHECK_EQ(after(m, 257), 1200 * MiB);  // dense weights read back from disk
    CHECK_EQ(after(m, 256), 1600 * MiB);
    // Under pressure, a target lower still wins.
    MemoryReading tight = cgroup(1314, 0);  // a target of 1000 MiB
    tight.pressure_some_avg10 = 30;
    CHECK_EQ(after(tight, 0), 1000 * MiB);
}

POLICY_TEST(budget_follows_a_lower_target_at_once_unless_it_is_noise) {
    // current 1600 MiB: a step is 1600 / 16 = 100 MiB, noise is less than half of one.
    auto after = [&](uint64_t target_mb) {
        BudgetPolicy p = policy(config());
        p.initial(cgroup(2314, 0), kPending, t0);
        return p.adapt(1600 * MiB, 0, 0, cgroup(target_mb + 314, 0), kPending, t0 + std::chrono::seconds(1));
    };
    CHECK_EQ(after(1560), 1600 * MiB);
    CHECK_EQ(after(1550), 1600 * MiB);
    CHECK_EQ(after(1540), 1540 * MiB);
    CHECK_EQ(after(700), 700 * MiB);
    CHECK_EQ(after(0), 0ull);
}

POLICY_TEST(budget_grows_back_2_s_after_the_last_shrink_up_to_its_cap) {
    for (const double cache_mb : {static_cast<double>(bmoe::kAuto), 1800.0}) {
        BudgetPolicy p = policy(config(cache_mb));
        const uint64_t opened = cache_mb > 0 ? 1800 * MiB : 2000 * MiB;
        CHECK_EQ(p.initial(cgroup(2314, 0), kPending, t0).budget, opened);
        const Time t = t0 + std::chrono::seconds(1);
        const uint64_t shrunk = p.adapt(opened, 0, 0, cgroup(1314, 0), kPending, t);  // a neighbour took 1000
        CHECK_EQ(shrunk, 1000 * MiB);
        const MemoryReading gone = cgroup(4314, 0);  // and left: a target of 4000 MiB
        CHECK_EQ(p.adapt(shrunk, 0, 0, gone, kPending, t + milliseconds(1750)), shrunk);
        // auto grows to the target (its ceiling is far), a fixed request to what was asked
        CHECK_EQ(p.adapt(shrunk, 0, 0, gone, kPending, t + milliseconds(2000)), cache_mb > 0 ? 1800 * MiB : 4000 * MiB);
    }
    // A target above by no more than a step (1000 / 16 = 62.5 MiB) is noise too.
    BudgetPolicy p = policy(config());
    p.initial(cgroup(1314, 0), kPending, t0);
    CHECK_EQ(p.adapt(1000 * MiB, 0, 0, cgroup(1374, 0), kPending, t0 + std::chrono::seconds(5)), 1000 * MiB);
    CHECK_EQ(p.adapt(1000 * MiB, 0, 0, cgroup(1384, 0), kPending, t0 + std::chrono::seconds(6)), 1070 * MiB);
}

POLICY_TEST(budget_the_pool_s_own_pages_are_the_cache_s) {
    // The cache holds 1500 MiB of pool pages, charged to the cgroup: they are not someone else's.
    BudgetPolicy p = policy(config());
    p.initial(cgroup(2314, 0), kPending, t0);
    const MemoryReading m = cgroup(2314, 1500);
    CHECK_EQ(p.adapt(2000 * MiB, 1500 * MiB, 0, m, kPending, t0 + std::chrono::seconds(1)), 2000 * MiB);
    CHECK_EQ(p.adapt(2000 * MiB, 0, 0, m, kPending, t0 + std::chrono::seconds(2)), 500 * MiB);
    // The same on the machine: available memory plus the pool, less the floor.
    BudgetPolicy q = policy(config());
    q.initial(machine(), kPending, t0);
    MemoryReading low = machine();
    low.mem_available = 2000 * MiB;
    // 2000 + 658 pool - 100 dense - 1024 floor - 250 - 64 = 1220
    CHECK_EQ(q.adapt(2658 * MiB, 658 * MiB, 0, low, kPending, t0 + std::chrono::seconds(1)), 1220 * MiB);
}

POLICY_TEST(budget_rebase_takes_a_prompt_s_compute_buffers_at_once_and_gives_them_back) {
    // A prompt's compute buffers (200 MiB of the pending bytes at open) are written, then given back:
    // rebase follows both moves at once, without adapt's 2 s wait or its noise band, up to the cap.
    BudgetPolicy p = policy(config());
    const BudgetReport r = p.initial(cgroup(1314, 0), kPending, t0);  // 1314 - 200 - 50 - 64
    CHECK_EQ(r.budget, 1000 * MiB);
    // After the prompt: its buffers are no longer pending and their pages are back (usage unchanged).
    CHECK_EQ(p.rebase(r.budget, 0, cgroup(1314, 0), 0, t0 + milliseconds(10)), 1200 * MiB);
    // adapt would have waited: a shrink 10 ms ago is no pressure, but growth waits for calm
    CHECK_EQ(p.adapt(1000 * MiB, 0, 0, cgroup(1314, 0), 0, t0 + milliseconds(300)), 1000 * MiB);
    // Before the next prompt, 120 MiB of them are to be written again: the budget makes room first.
    CHECK_EQ(p.rebase(1200 * MiB, 0, cgroup(1314, 0), 120 * MiB, t0 + milliseconds(20)), 1080 * MiB);
    // A fixed request stays the most it may hold; with the cache off nothing moves.
    BudgetPolicy fixed = policy(config(600));
    fixed.initial(cgroup(1314, 0), kPending, t0);
    CHECK_EQ(fixed.rebase(600 * MiB, 0, cgroup(1314, 0), 0, t0 + milliseconds(10)), 600 * MiB);
    BudgetPolicy off = policy(config(0));
    off.initial(cgroup(1314, 0), kPending, t0);
    CHECK_EQ(off.rebase(0, 0, cgroup(1314, 0), 0, t0 + milliseconds(10)), 0);
}

POLICY_TEST(budget_after_a_release_grows_by_what_was_given_back_not_by_the_drift_since_open) {
    // At open 300 MiB are charged, a drafter's 30 among them: 1314 - 300 - 200 - 50 - 64.
    BudgetPolicy p = policy(config());
    CHECK_EQ(p.initial(cgroup(1314, 300), kPending, t0).budget, 700 * MiB);
    // By its sleep 5 MiB more are charged (page tables, allocator arenas), inside adapt's noise band.
    CHECK_EQ(p.adapt(700 * MiB, 0, 0, cgroup(1314, 305), kPending, t0 + milliseconds(300)), 700 * MiB);
    // It gives back its 30 MiB and 10 MiB of its pages it would still have touched: the budget takes
    // those 40 MiB, where a fresh look (1314 - 275 - 190 - 50 - 64) would have taken 35.
    CHECK_EQ(p.after_release(700 * MiB, 0, cgroup(1314, 305), kPending, cgroup(1314, 275), kPending - 10 * MiB,
                             t0 + milliseconds(400)),
             740 * MiB);
    // A budget below what memory affords (a shrink under pressure that adapt has not grown back yet):
    // the fresh look (1314 - 275 - 200 - 50 - 64), when it is more than that budget and the 30 MiB.
    CHECK_EQ(p.after_release(600 * MiB, 0, cgroup(1314, 305), kPending, cgroup(1314, 275), kPending,
                             t0 + milliseconds(500)),
             725 * MiB);
    // Nothing given back (or more charged): the budget stays, adapt judges the rest.
    CHECK_EQ(p.after_release(700 * MiB, 0, cgroup(1314, 305), kPending, cgroup(1314, 310), kPending,
                             t0 + milliseconds(600)),
             700 * MiB);
    // A fixed request is the most it takes; with the cache off nothing moves.
    BudgetPolicy fixed = policy(config(710));
    fixed.initial(cgroup(1314, 300), kPending, t0);
    CHECK_EQ(fixed.after_release(700 * MiB, 0, cgroup(1314, 305), kPending, cgroup(1314, 275), kPending, t0), 710 * MiB);
    BudgetPolicy off = policy(config(0));
    off.initial(cgroup(1314, 300), kPending, t0);
    CHECK_EQ(off.after_release(0, 0, cgroup(1314, 305), kPending, cgroup(1314, 275), kPending, t0), 0);
}

POLICY_TEST(budget_a_prompt_s_ubatch_is_the_one_its_compute_buffers_fit) {
    // The 3 GB preset at ctx 2304 (flash attention off): 302 MiB of compute buffers for a ubatch of 2048
    // (~151 KiB a token: the KQ scores, 2304 x 12 heads x 4 B, and the activations).
    const uint64_t scratch = 302 * MiB;
    // Room for all of them: the context's ubatch, the prompt in one.
    CHECK_EQ(BudgetPolicy::affordable_ubatch(2048, scratch, 500 * static_cast<int64_t>(MiB)), 2048);
    CHECK_EQ(BudgetPolicy::affordable_ubatch(2048, scratch, 302 * static_cast<int64_t>(MiB)), 2048);
    // Room for half: the largest multiple of 64 whose share fits (151 MiB: 1024 tokens).
    CHECK_EQ(BudgetPolicy::affordable_ubatch(2048, scratch, 151 * static_cast<int64_t>(MiB)), 1024);
    CHECK_EQ(BudgetPolicy::affordable_ubatch(2048, scratch, 150 * static_cast<int64_t>(MiB)), 960);
    // Never below 64 tokens (a prompt read once per handful of tokens would be worse than the limit says),
    // nor with no room at all (the budget's own check says so at open); a small ubatch is kept.
    CHECK_EQ(BudgetPolicy::affordable_ubatch(2048, scratch, 1 * static_cast<int64_t>(MiB)), 64);
    CHECK_EQ(BudgetPolicy::affordable_ubatch(2048, scratch, -100 * static_cast<int64_t>(MiB)), 64);
    CHECK_EQ(BudgetPolicy::affordable_ubatch(32, scratch, 0), 32);
    // What a prompt's compute buffers may use: the headroom less the rest still to touch, the experts in
    // flight and the margin, with the cache emptied.
    BudgetPolicy p = policy(config());
    CHECK_EQ(p.prompt_room(cgroup(1314, 0), 0, 200 * MiB), static_cast<int64_t>(1000 * MiB));
    CHECK_EQ(p.prompt_room(cgroup(1314, 400), 0, 200 * MiB), static_cast<int64_t>(600 * MiB));
    // The pool's pages are the cache's: a prompt may have them.
    CHECK_EQ(p.prompt_room(cgroup(1314, 400), 300 * MiB, 200 * MiB), static_cast<int64_t>(900 * MiB));
}
