#include "policy/prefetch_policy.h"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace bmoe::detail {
namespace {

template <typename Field>
double median_of(const std::deque<PrefetchPolicy::DecodeEstimate> & samples, Field field) {
    std::vector<double> v;
    for (const auto & s : samples) {
        v.push_back(s.*field);
    }
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n == 0 ? 0 : n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

bool PrefetchPolicy::reads_ahead() const {
    switch (mode_) {
        case Mode::Off:
            return false;
        case Mode::Predict:
            return true;
        case Mode::Auto:
            return on_ && since_sample_ < kResampleEvery;
    }
    return false;
}

PrefetchPolicy::DecodeEstimate PrefetchPolicy::estimate(const DecodeSample & s) {
    DecodeEstimate e;
    // The drive's bandwidth as this decode's on-demand reads got it; without reads, nothing was missed, so
    // no guess would have saved anything either (a right guess of an uncached expert is a read saved).
    const double bytes_per_ms = s.io_ms > 0 && s.read_bytes > 0 ? static_cast<double>(s.read_bytes) / s.io_ms : 0;
    e.idle_ms = std::max(0.0, s.wall_ms - s.io_ms);
    if (bytes_per_ms > 0 && s.wall_ms > 0) {
        const uint64_t wrong = std::min(s.guessed_bytes, s.guessed_wasted_bytes);
        e.wrong_ms = static_cast<double>(wrong) / bytes_per_ms;
        const double right_ms = static_cast<double>(s.guessed_bytes - wrong) / bytes_per_ms;
        const double saved_ms = std::min({right_ms, e.idle_ms, s.stall_ms});
        e.gain = (saved_ms - e.wrong_ms - kBlocking * s.io_ms) / s.wall_ms;
    }
    return e;
}

void PrefetchPolicy::record(const DecodeSample & sample) {
    if (mode_ != Mode::Auto) {
        return;
    }
    if (sample.read_ahead) {
        ++since_sample_;
        return;
    }
    samples_.push_back(estimate(sample));
    if (samples_.size() > kSamples) {
        samples_.pop_front();
    }
    since_sample_ = 0;
    const DecodeEstimate m = median();
    on_ = samples_.size() >= kMinSamples && m.gain >= kMinGain;
}

PrefetchPolicy::DecodeEstimate PrefetchPolicy::median() const {
    return {median_of(samples_, &DecodeEstimate::idle_ms), median_of(samples_, &DecodeEstimate::wrong_ms),
            median_of(samples_, &DecodeEstimate::gain)};
}

std::string PrefetchPolicy::state() const {
    if (mode_ != Mode::Auto) {
        return reads_ahead() ? "on" : "off";
    }
    if (samples_.empty()) {
        return "sampling";
    }
    const DecodeEstimate m = median();
    char text[96];
    std::snprintf(text, sizeof(text), "%s (saves %.0f%%: %.0f ms idle, %.0f ms of wrong guesses)", on_ ? "on" : "off",
                  100 * m.gain, m.idle_ms, m.wrong_ms);
    return text;
}

}  // namespace bmoe::detail
