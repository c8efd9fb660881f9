// PrefetchPolicy (prefetch_policy.h, docs/streaming.md "Read-ahead"): predict reads ahead in
// every decode; auto measures 8 decodes without, 16 with, 8 without, keeps the faster setting (by the
// medians; off only when it is faster by more than 1%) for 120 decodes, twice as long each time the
// next probe agrees (up to 960), then measures again.
#include <functional>
#include <string>
#include <vector>

#include "check.h"
#include "policy/prefetch_policy.h"

using bmoe::detail::PrefetchPolicy;

namespace {

using Mode = PrefetchPolicy::Mode;

// `n` decodes, the i-th (counting from `first`) taking ms(i, reads_ahead): what the policy chose for each.
std::vector<bool> decode(PrefetchPolicy & p, int n, const std::function<double(int, bool)> & ms, int first = 0) {
    std::vector<bool> chosen;
    for (int i = first; i < first + n; ++i) {
        const bool on = p.reads_ahead();
        chosen.push_back(on);
        p.record(ms(i, on));
    }
    return chosen;
}

std::vector<bool> runs(std::vector<std::pair<int, bool>> spans) {
    std::vector<bool> out;
    for (const auto & [n, on] : spans) {
        out.insert(out.end(), static_cast<size_t>(n), on);
    }
    return out;
}

const std::vector<bool> kProbe = runs({{8, false}, {16, true}, {8, false}});

}  // namespace

POLICY_TEST(prefetch_off_never_reads_ahead_and_predict_always_does) {
    PrefetchPolicy off(Mode::Off);
    CHECK_EQ(decode(off, 200, [](int, bool) { return 1.0; }), runs({{200, false}}));
    CHECK_EQ(off.state(), std::string("off"));
    PrefetchPolicy predict(Mode::Predict);
    // However slow reading ahead is, predict does not measure.
    CHECK_EQ(decode(predict, 200, [](int, bool on) { return on ? 100.0 : 1.0; }), runs({{200, true}}));
    CHECK_EQ(predict.state(), std::string("on"));
}

POLICY_TEST(prefetch_auto_probes_8_off_16_on_8_off) {
    PrefetchPolicy p(Mode::Auto);
    CHECK_EQ(p.state(), std::string("probing"));
    CHECK_EQ(decode(p, 31, [](int, bool on) { return on ? 10.0 : 12.0; }), std::vector<bool>(kProbe.begin(), kProbe.end() - 1));
    CHECK_EQ(p.state(), std::string("probing"));
    CHECK_EQ(decode(p, 1, [](int, bool) { return 12.0; }), runs({{1, false}}));  // the probe's last decode
    CHECK_EQ(p.state(), std::string("on (measured 1.20x)"));
}

POLICY_TEST(prefetch_auto_keeps_the_faster_setting_for_120_decodes_then_measures_again) {
    PrefetchPolicy p(Mode::Auto);
    const auto on_wins = [](int, bool on) { return on ? 10.0 : 12.0; };
    const auto off_wins = [](int, bool on) { return on ? 12.0 : 10.0; };
    CHECK_EQ(decode(p, 32, on_wins), kProbe);
    CHECK_EQ(decode(p, 120, on_wins), runs({{120, true}}));
    CHECK_EQ(p.state(), std::string("on (measured 1.20x)"));
    // The second probe: the same windows, and now reading ahead loses.
    CHECK_EQ(decode(p, 32, off_wins), kProbe);
    CHECK_EQ(p.state(), std::string("off (measured 0.83x)"));
    CHECK_EQ(decode(p, 120, off_wins), runs({{120, false}}));
    CHECK_EQ(decode(p, 8, off_wins), runs({{8, false}}));  // the third probe's first window
    CHECK_EQ(decode(p, 1, off_wins), runs({{1, true}}));
}

POLICY_TEST(prefetch_auto_a_steady_drift_cancels_out) {
    // Decodes get 1 ms faster each (a cache filling up) and reading ahead costs 10 ms (5%): off-on-on-off
    // sees the cost; off then on would credit the drift (16 ms) to reading ahead.
    PrefetchPolicy p(Mode::Auto);
    CHECK_EQ(decode(p, 32, [](int i, bool on) { return 200.0 - i + (on ? 10.0 : 0.0); }), kProbe);
    CHECK_EQ(decode(p, 120, [](int, bool) { return 10.0; }), runs({{120, false}}));
    // The same drift with no difference: a tie keeps reading ahead (its cost there is bandwidth, not time).
    PrefetchPolicy tie(Mode::Auto);
    decode(tie, 32, [](int i, bool) { return 200.0 - i; });
    CHECK_EQ(tie.state(), std::string("on (measured 1.00x)"));
    CHECK(tie.reads_ahead());
}

POLICY_TEST(prefetch_auto_turns_off_only_for_a_loss_beyond_the_margin) {
    PrefetchPolicy small(Mode::Auto);  // reading ahead 0.5% slower: within the margin, kept
    decode(small, 32, [](int, bool on) { return on ? 10.05 : 10.0; });
    CHECK(small.reads_ahead());
    // 2.5% slower, the Pi 5 Gen 2 class's measurement (296.3 against 288.9 ms, medians; 2.6% here): off
    PrefetchPolicy saturated(Mode::Auto);
    decode(saturated, 32, [](int, bool on) { return on ? 296.5 : 288.9; });
    CHECK(!saturated.reads_ahead());
    CHECK_EQ(saturated.state(), std::string("off (measured 0.97x)"));
    PrefetchPolicy loss(Mode::Auto);   // 5% slower: off
    decode(loss, 32, [](int, bool on) { return on ? 10.5 : 10.0; });
    CHECK(!loss.reads_ahead());
    CHECK_EQ(loss.state(), std::string("off (measured 0.95x)"));
}

POLICY_TEST(prefetch_auto_one_stalled_decode_does_not_decide) {
    // Reading ahead pays 1.6x; one decode with it stalls 2 s (another process had the disk): the mean of
    // the 16 would say off, the median says on.
    PrefetchPolicy p(Mode::Auto);
    decode(p, 32, [](int i, bool on) { return i == 12 ? 2000.0 : on ? 100.0 : 160.0; });
    CHECK(p.reads_ahead());
    CHECK_EQ(p.state(), std::string("on (measured 1.60x)"));
    // And in an off window, a stalled decode does not make reading ahead look better than it is.
    PrefetchPolicy q(Mode::Auto);
    decode(q, 32, [](int i, bool on) { return i == 3 ? 2000.0 : on ? 10.5 : 10.0; });
    CHECK(!q.reads_ahead());
}

POLICY_TEST(prefetch_auto_probes_less_often_while_they_agree) {
    PrefetchPolicy p(Mode::Auto);
    const auto on_wins = [](int, bool on) { return on ? 10.0 : 16.0; };
    const auto off_wins = [](int, bool on) { return on ? 16.0 : 10.0; };
    CHECK_EQ(decode(p, 32, on_wins), kProbe);
    for (int stretch : {120, 240, 480, 960, 960}) {
        CHECK_EQ(decode(p, stretch, on_wins), runs({{stretch, true}}));
        CHECK_EQ(decode(p, 32, on_wins), kProbe);  // the next probe
    }
    // A probe that disagrees starts over at 120.
    CHECK_EQ(decode(p, 960, on_wins), runs({{960, true}}));
    CHECK_EQ(decode(p, 32, off_wins), kProbe);
    CHECK_EQ(decode(p, 120, off_wins), runs({{120, false}}));
    CHECK_EQ(decode(p, 1, off_wins), runs({{1, false}}));  // the next probe's first window is off
    CHECK_EQ(decode(p, 7, off_wins), runs({{7, false}}));
    CHECK_EQ(decode(p, 1, off_wins), runs({{1, true}}));
}
