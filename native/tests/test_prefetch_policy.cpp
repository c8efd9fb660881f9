// PrefetchPolicy (prefetch_policy.h, docs/streaming.md "Read-ahead"): predict reads ahead in every decode;
// auto reads nothing ahead until a decode without it has shown the drive's idle time and what the guesses
// would have read, then reads ahead while the right guesses' reads moved into the idle time, less the wrong
// ones' read time and a tenth of the decode's reads (guesses in flight delay them), save at least 2% of a
// decode (medians of the last 5 such decodes, at least 3), with one decode in 16 left without to see the
// drive again.
#include <functional>
#include <string>
#include <vector>

#include "check.h"
#include "policy/prefetch_policy.h"

using bmoe::detail::DecodeSample;
using bmoe::detail::PrefetchPolicy;

namespace {

using Mode = PrefetchPolicy::Mode;
constexpr uint64_t kMB = 1000 * 1000;

// A drive and a model, one decode: `compute_ms` of compute, `demand_mb` read on demand at `mb_per_s`, and the
// guesses' not-cached experts (`guessed_mb`, of which `wasted_mb` the router did not choose). Without
// read-ahead a layer's reads wait for its router, and its compute for its reads: the decode is its compute
// plus its reads.
struct Drive {
    double compute_ms;
    double demand_mb;
    double mb_per_s;
    double guessed_mb;
    double wasted_mb;

    DecodeSample without() const {
        const double io_ms = demand_mb / mb_per_s * 1000;
        return {compute_ms + io_ms, io_ms, io_ms, static_cast<uint64_t>(demand_mb * kMB),
                static_cast<uint64_t>(guessed_mb * kMB), static_cast<uint64_t>(wasted_mb * kMB), false};
    }
    DecodeSample with() const {
        DecodeSample s = without();
        s.read_ahead = true;
        return s;
    }
};

// `n` decodes on `drive`: what the policy chose for each.
std::vector<bool> decode(PrefetchPolicy & p, int n, const std::function<DecodeSample(int, bool)> & sample) {
    std::vector<bool> chosen;
    for (int i = 0; i < n; ++i) {
        const bool on = p.reads_ahead();
        chosen.push_back(on);
        DecodeSample s = sample(i, on);
        s.read_ahead = on;
        p.record(s);
    }
    return chosen;
}

std::vector<bool> decode(PrefetchPolicy & p, int n, const Drive & drive) {
    return decode(p, n, [&drive](int, bool on) { return on ? drive.with() : drive.without(); });
}

std::vector<bool> runs(std::vector<std::pair<int, bool>> spans) {
    std::vector<bool> out;
    for (const auto & [n, on] : spans) {
        out.insert(out.end(), static_cast<size_t>(n), on);
    }
    return out;
}

// Reading ahead pays: a fast drive idle most of the decode, guesses mostly right.
const Drive kIdleDrive{60, 40, 2000, 30, 2};
// It does not: the drive reads through nearly the whole decode (a Pi 5's NVMe at a 40% cap), and the wrong
// guesses would cost more than the idle time the right ones could use.
const Drive kBusyDrive{60, 225, 430, 45, 25};

}  // namespace

POLICY_TEST(prefetch_off_never_reads_ahead_and_predict_always_does) {
    PrefetchPolicy off(Mode::Off);
    CHECK_EQ(decode(off, 40, kIdleDrive), runs({{40, false}}));
    CHECK(!off.guesses_only());
    CHECK_EQ(off.state(), std::string("off"));
    PrefetchPolicy predict(Mode::Predict);
    CHECK_EQ(decode(predict, 40, kBusyDrive), runs({{40, true}}));
    CHECK_EQ(predict.state(), std::string("on"));
}

POLICY_TEST(prefetch_auto_decides_after_three_decodes_and_reads_nothing_ahead_before) {
    PrefetchPolicy idle(Mode::Auto);
    CHECK_EQ(idle.state(), std::string("sampling"));
    CHECK(idle.guesses_only());  // the first decodes guess, and count, without reading
    CHECK_EQ(decode(idle, 16, kIdleDrive), runs({{3, false}, {13, true}}));
    // 40 MB at 2 GB/s: 20 ms of reads in an 80 ms decode, 60 idle; of 30 MB of guesses 28 right (14 ms of reads
    // into the idle time) and 2 wrong (1 ms), and 2 ms of the reads delayed: 11 ms saved.
    CHECK_EQ(idle.state(), std::string("on (saves 14%: 60 ms idle, 1 ms of wrong guesses)"));
    PrefetchPolicy busy(Mode::Auto);
    CHECK_EQ(decode(busy, 16, kBusyDrive), runs({{16, false}}));
    CHECK(busy.guesses_only());  // and it keeps looking
    // 20 MB of right guesses (47 ms) could fill most of the 60 ms idle; 25 MB of wrong ones cost 58 ms, and
    // guesses in flight would delay 523 ms of reads by 52.
    CHECK_EQ(busy.state(), std::string("off (saves -11%: 60 ms idle, 58 ms of wrong guesses)"));
    // One decode, however idle the drive looked (the first after a prompt touches its pages), decides nothing.
    PrefetchPolicy first(Mode::Auto);
    CHECK_EQ(decode(first, 3, [](int i, bool) { return i == 0 ? kIdleDrive.without() : kBusyDrive.without(); }),
             runs({{3, false}}));
    CHECK(!first.reads_ahead());
}

POLICY_TEST(prefetch_auto_looks_again_every_16_decodes_and_follows_the_drive) {
    PrefetchPolicy p(Mode::Auto);
    const std::vector<bool> once_in_16 = runs({{16, true}, {1, false}});
    CHECK_EQ(decode(p, 3, kIdleDrive), runs({{3, false}}));
    CHECK_EQ(decode(p, 17, kIdleDrive), once_in_16);
    CHECK_EQ(decode(p, 17, kIdleDrive), once_in_16);
    // The drive turns busy (another process reads): reading ahead still runs until the decodes without it
    // outvote the earlier ones (medians of 5: the third busy one), then stops.
    std::vector<bool> got = decode(p, 3 * 17, kBusyDrive);
    CHECK_EQ(got, runs({{16, true}, {1, false}, {16, true}, {1, false}, {16, true}, {1, false}}));
    CHECK_EQ(decode(p, 10, kBusyDrive), runs({{10, false}}));
    // And back: the idle decodes outvote the busy ones in three.
    CHECK_EQ(decode(p, 3, kIdleDrive), runs({{3, false}}));
    CHECK_EQ(decode(p, 2, kIdleDrive), runs({{2, true}}));
}

POLICY_TEST(prefetch_auto_one_stalled_decode_does_not_decide) {
    PrefetchPolicy p(Mode::Auto);
    decode(p, 3 + 2 * 17 + 16, kIdleDrive);  // five decodes without read-ahead, the next one due
    CHECK(!p.reads_ahead());
    // That decode: another process held the drive for 2 s. The median of the last 5 still says the drive
    // has room.
    decode(p, 1, [](int, bool) {
        DecodeSample s = kBusyDrive.without();
        s.wall_ms += 2000;
        s.io_ms += 2000;
        return s;
    });
    CHECK(p.reads_ahead());
}

POLICY_TEST(prefetch_auto_stays_off_where_the_reads_already_hide_under_compute) {
    // The flagship's shape at Gen 2 on one thread: 600 ms of compute, 230 MB read in 150 ms beside it (overlap),
    // compute waiting 20 ms for them. However right the guesses, reading them earlier saves at most those 20 ms,
    // less the 15 ms the guesses in flight cost the reads and the 1 ms of wrong ones: below the margin.
    PrefetchPolicy p(Mode::Auto);
    const auto overlapped = [](int, bool) {
        return DecodeSample{620, 150, 20, 230 * kMB, 220 * kMB, 2 * kMB, false};
    };
    CHECK_EQ(decode(p, 4, overlapped), runs({{4, false}}));
    CHECK_EQ(p.state(), std::string("off (saves 1%: 470 ms idle, 1 ms of wrong guesses)"));
}

POLICY_TEST(prefetch_auto_wants_a_gain_beyond_the_margin) {
    // Plenty of idle time, but the right guesses save what the wrong ones cost: not worth the cache memory
    // staged guesses take.
    PrefetchPolicy p(Mode::Auto);
    CHECK_EQ(decode(p, 4, Drive{100, 20, 2000, 2, 1}), runs({{4, false}}));
    // Nothing read on demand (every expert cached): no guess could save a read.
    PrefetchPolicy cached(Mode::Auto);
    CHECK_EQ(decode(cached, 4, Drive{50, 0, 2000, 0, 0}), runs({{4, false}}));
}

// The first three decodes without read-ahead as the campaigns recorded them (`tokens.csv` of their `defaults`
// cells: wall, on-demand read and stall ms; MB read, guessed, of which wrong): the 3 GB Q4_K preset (uniform
// routing, 40% cap) from bench-data/2026-12-05/prefetch-signals/*-Q4_K-16 (repeat 0), the flagship's shape
// (skewed, 6.5 GB cap) from bench-data/2026-12-05/flagship/*. What auto chooses at each class, against what the
// campaigns measured there (docs/benchmarks.md, 2026-12-05 afternoon).
namespace {

DecodeSample recorded(double wall, double io, double stall, double mb, double guessed_mb, double wasted_mb) {
    return {wall, io, stall, static_cast<uint64_t>(mb * kMB), static_cast<uint64_t>(guessed_mb * kMB),
            static_cast<uint64_t>(wasted_mb * kMB), false};
}

bool chosen_after(const std::vector<DecodeSample> & first_three) {
    PrefetchPolicy p(Mode::Auto);
    for (const DecodeSample & s : first_three) {
        CHECK(!p.reads_ahead());
        p.record(s);
    }
    return p.reads_ahead();
}

}  // namespace

POLICY_TEST(prefetch_auto_uniform_routing_at_gen2_gen3_and_microsd) {
    // Gen 2: the drive idles 207, then 71, then 24 ms of a ~600 ms decode, and a tenth of its reads is more than
    // what the right guesses could save there: off (measured: `--prefetch off` 1.75 tok/s, reading ahead no faster).
    CHECK(!chosen_after({recorded(671, 464, 428, 268, 256, 5), recorded(606, 535, 492, 272, 264, 3),
                         recorded(593, 569, 530, 255, 242, 0)}));
    // Gen 3: twice the bandwidth, 40-96 ms idle of ~300: on (measured a tie with off, 0.98-0.99x the best).
    CHECK(chosen_after({recorded(348, 252, 215, 266, 254, 5), recorded(306, 228, 180, 268, 260, 3),
                        recorded(294, 254, 217, 253, 240, 0)}));
    // microSD: the drive reads through 2.8 of 3 s: off (measured 0.99x of the best, 0.99x of the I/O limit).
    CHECK(!chosen_after({recorded(2985, 2896, 2856, 268, 256, 5), recorded(3002, 2961, 2912, 272, 264, 3),
                         recorded(2798, 2765, 2720, 255, 242, 0)}));
}

POLICY_TEST(prefetch_auto_skewed_routing_at_gen2_gen3_and_microsd) {
    // The flagship's shape, compute-bound on one thread: the compute waits 80-160 ms for reads, and the guesses
    // are right (skewed routing): on at Gen 2 and Gen 3 (measured 1.06x and 1.07x of `--prefetch off`).
    CHECK(chosen_after({recorded(1348, 259, 159, 472, 451, 2), recorded(954, 172, 92, 334, 323, 0),
                        recorded(837, 154, 82, 281, 268, 2)}));
    CHECK(chosen_after({recorded(1281, 229, 142, 472, 451, 2), recorded(952, 164, 88, 334, 323, 0),
                        recorded(804, 140, 72, 281, 268, 2)}));
    // microSD, derived from Gen 2's decodes (not measured): the same bytes at 90 MB/s take 4.8x the read time,
    // the same compute and the same overlap (read time less stall); the compute then waits 0.66-1.14 s of each
    // decode, and the drive idles 0.68-1.09 s: on.
    CHECK(chosen_after({recorded(2326, 1237, 1137, 472, 451, 2), recorded(1604, 822, 742, 334, 323, 0),
                        recorded(1419, 736, 664, 281, 268, 2)}));
}
