#include "prefetch_policy.h"

#include <cstdio>

namespace bmoe::detail {

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
        if (++done_ >= kExploit) {
            probing_ = true;
            done_ = 0;
            sum_on_ = sum_off_ = 0;
            n_on_ = n_off_ = 0;
        }
        return;
    }
    if (probe_on()) {
        sum_on_ += ms;
        ++n_on_;
    } else {
        sum_off_ += ms;
        ++n_off_;
    }
    if (++done_ < 4 * kWindow) {
        return;
    }
    const double on = sum_on_ / n_on_;
    const double off = sum_off_ / n_off_;
    measured_ = on > 0 ? off / on : 0;
    chosen_on_ = on < off;  // a tie keeps the simpler setting
    probing_ = false;
    done_ = 0;
}

std::string PrefetchPolicy::state() const {
    if (mode_ != Mode::Auto) {
        return reads_ahead() ? "on" : "off";
    }
    if (probing_ && measured_ == 0) {
        return "probing";
    }
    char text[48];
    std::snprintf(text, sizeof(text), "%s (measured %.2fx)", chosen_on_ ? "on" : "off", measured_);
    return text;
}

}  // namespace bmoe::detail
