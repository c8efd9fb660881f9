// When to read ahead. "predict": every decode. "auto": only while it measurably pays: reading
// ahead competes with the reads a layer really needs when the storage has no spare bandwidth (a
// phone's flash lost 21% to it in the seed project's measurements), and no counter says that in
// advance. So auto measures: windows of decodes with and without read-ahead, in the order
// off-on-on-off (a steady drift, such as a cache filling, cancels out), then the faster setting
// for a stretch, then measures again. A loss is bounded by the probes' share of the run, and that
// share shrinks while the probes keep agreeing.
// Pure policy: it sees decode times and says yes or no.
#pragma once

#include <string>
#include <vector>

namespace bmoe::detail {

class PrefetchPolicy {
public:
    enum class Mode { Off, Predict, Auto };
    static constexpr int kWindow = 8;         // decodes per probe window
    static constexpr int kExploit = 120;      // decodes between the first probes
    static constexpr int kMaxExploit = 960;   // the stretch doubles each time a probe agrees with the last
    // Reading ahead is turned off only when that measured faster by more than this: a tie keeps it
    // (where the drive has idle time a wrong guess costs bandwidth, not time), and the medians of 16
    // decodes a side keep one stalled decode from deciding. Not more: at a drive with no idle time
    // (the Pi 5's NVMe classes) the 1-2% of wrong guesses are bytes, and bytes are time there —
    // reading ahead measured 2.4-2.5% slower at Gen 2 over 160 tokens, which a 3% margin kept on
    // (bench-data/2026-12-02/storage-2). Where it pays, it pays far more than 1% (1.24x here).
    static constexpr double kOffMargin = 0.01;

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
    bool probed_ = false;     // a probe has ended (its choice is chosen_on_)
    int done_ = 0;            // decodes recorded in the current phase
    int exploit_ = kExploit;  // decodes of the current stretch
    std::vector<double> on_, off_;  // the probe's decode times (medians: one decode the machine stalled moves nothing)
    bool chosen_on_ = false;
    double measured_ = 0;     // off time / on time of the last probe
};

}  // namespace bmoe::detail
