#include "policy/prefetch_policy.h"

#include <algorithm>
#include <cstdio>

namespace bmoe::detail {
namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n == 0 ? 0 : n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

bool PrefetchPolicy::probe_on() const {
    const int window = done_ / kWindow;  // 0 off, 1 on, 2 on, 3 off
    return window == 1 || window == 2;
}

bool PrefetchPolicy::reads_ahead() const {
    switch (mode_) {
        case Mode::Off:
            return false;
        case Mode::Predict:
            return true;
        case Mode::Auto:
            return probing_ ? probe_on() : chosen_on_;
    }
    return false;
}

void PrefetchPolicy::record(double ms) {
    if (mode_ != Mode::Auto) {
        return;
    }
    if (!probing_) {
        if (++done_ >= exploit_) {
            probing_ = true;
            done_ = 0;
            on_.clear();
            off_.clear();
        }
        return;
    }
    (probe_on() ? on_ : off_).push_back(ms);
    if (++done_ < 4 * kWindow) {
        return;
    }
    const double on = median(on_);
    const double off = median(off_);
    measured_ = on > 0 ? off / on : 0;
    const bool choose_on = off * (1 + kOffMargin) >= on;
    exploit_ = probed_ && choose_on == chosen_on_ ? std::min(2 * exploit_, kMaxExploit) : kExploit;
    chosen_on_ = choose_on;
    probed_ = true;
    probing_ = false;
    done_ = 0;
}

std::string PrefetchPolicy::state() const {
    if (mode_ != Mode::Auto) {
        return reads_ahead() ? "on" : "off";
    }
    if (probing_ && !probed_) {
        return "probing";
    }
    char text[48];
    std::snprintf(text, sizeof(text), "%s (measured %.2fx)", chosen_on_ ? "on" : "off", measured_);
    return text;
}

}  // namespace bmoe::detail
