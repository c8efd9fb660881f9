// When to read ahead. "predict": every decode. "auto": only while it measurably pays: reading
// ahead competes with the reads a layer really needs when the storage has no spare bandwidth (a
// phone's flash lost 21% to it in the seed project's measurements), and no counter says that in
// advance. So auto measures: windows of decodes with and without read-ahead, in the order
// off-on-on-off (a steady drift, such as a cache filling, cancels out), then the faster setting
// for a long stretch, then measure again. A loss is bounded by the probes' share of the run.
// Pure policy: it sees decode times and says yes or no.
#pragma once

#include <string>

namespace bmoe::detail {

class PrefetchPolicy {
public:
    enum class Mode { Off, Predict, Auto };
    static constexpr int kWindow = 8;     // decodes per probe window
    static constexpr int kExploit = 120;  // decodes between probes

    explicit PrefetchPolicy(Mode mode) : mode_(mode) {}

    // Whether the next single-token decode reads ahead.
    bool reads_ahead() const;
    // A decode of one token (prompts and speculative batches are not comparable) took `ms`.
    void record(double ms);
    // "off", "on", "probing", "on (measured 1.12x)", "off (measured 0.97x)": for the telemetry.
    std::string state() const;

private:
    bool probe_on() const;  // in the probe, the setting of the current window

    Mode mode_;
    bool probing_ = true;
    int done_ = 0;            // decodes recorded in the current phase
    double sum_on_ = 0, sum_off_ = 0;
    int n_on_ = 0, n_off_ = 0;
    bool chosen_on_ = false;
    double measured_ = 0;     // off time / on time of the last probe
};

}  // namespace bmoe::detail
