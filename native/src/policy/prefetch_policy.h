// When to read ahead. "predict": every decode. "auto": where the drive and the guesses say it pays, from
// the second decode on. Reading ahead can only fill time the drive would otherwise sit idle (while a layer
// computes, before the next router has chosen): where the drive has none (a Pi 5's NVMe, a microSD card)
// every wrongly guessed byte is read in the critical path, and a guess being read when the next layer's
// own reads arrive delays them (lanes do not preempt a read). The seed project lost 21% to it on a phone's
// flash; `auto`'s old probe (8 decodes off, 16 on, 8 off, decided by their timing) read ahead for decodes
// 8-23 whatever the drive showed and cost a short answer at the Pi 5 Gen 2 class 11% (issue 48).
//
// So auto never times on against off. It reads nothing ahead until a decode has shown, without reading
// ahead: how long the drive sat idle (wall time less on-demand read time), the drive's bandwidth (bytes
// over read time), and what reading ahead would have read (the guesses are still made and checked against
// the router: the bytes of guessed experts not cached, and of those the router did not choose). A right
// guess is a read moved earlier, into the drive's idle time: it saves at most that idle time, at most its
// own read time, and at most the time compute waited for reads (with overlap, a compute-bound decode's reads
// already hide under its compute). A wrong one is a read more, and costs its read time wherever the drive has no time to
// spare (counted always: auto must never lose). And guesses in flight delay the next layer's own reads
// (kBlocking of the decode's read time). It reads ahead while the saving less the costs is at least kMinGain
// of a decode, by the medians of at least kMinSamples decodes without (the first decode after a prompt is
// one, and not a typical one: its pool pages are touched for the first time). While reading ahead, one decode
// in kResampleEvery runs without, to see the drive again. Pure policy: it sees one decode's numbers at a time
// and says yes or no.
#pragma once

#include <cstdint>
#include <deque>
#include <string>

namespace bmoe::detail {

// One single-token decode, as the streamer counted it.
struct DecodeSample {
    double wall_ms = 0;
    double io_ms = 0;              // on-demand reads in flight (read-ahead not counted)
    double stall_ms = 0;           // compute waiting for reads
    uint64_t read_bytes = 0;       // read on demand (and ahead, when it read ahead)
    uint64_t guessed_bytes = 0;    // guessed experts not cached: read ahead, or only counted
    uint64_t guessed_wasted_bytes = 0;  // ... of experts the router did not choose
    bool read_ahead = false;
};

class PrefetchPolicy {
public:
    enum class Mode { Off, Predict, Auto };
    // The decision is the median of the last few decodes without read-ahead (one decode the machine stalled
    // moves nothing); until there are kMinSamples, nothing is read ahead.
    static constexpr size_t kSamples = 5;
    static constexpr size_t kMinSamples = 3;
    // What guesses being read cost the next layer's reads, as a share of the decode's read time: the cost the
    // idle-time model misses, measured. At the Pi 5 Gen 2 class reading ahead ran 1% slower where the model
    // without this term said 7% faster (a 600 ms decode, 520 ms of it reading); at this VM's drive 16%
    // faster where it said 17% (145 ms, 120 reading) (bench-data/2026-12-05/prefetch-signals/first-policy).
    static constexpr double kBlocking = 0.1;
    // Read ahead where it saves at least this share of a decode (below it, a tie: not worth the memory staged
    // guesses take from the cache).
    static constexpr double kMinGain = 0.02;
    static constexpr int kResampleEvery = 16;

    explicit PrefetchPolicy(Mode mode) : mode_(mode) {}

    // Whether the next single-token decode reads ahead.
    bool reads_ahead() const;
    // Whether its layers still guess (auto, not reading ahead: the guesses are counted, not read).
    bool guesses_only() const { return mode_ == Mode::Auto && !reads_ahead(); }
    void record(const DecodeSample & sample);
    // "off", "on", "sampling", "on (saves 17%: 26 ms idle, 1 ms of wrong guesses)": for the telemetry.
    std::string state() const;

    // What one decode without read-ahead says reading ahead would have done.
    struct DecodeEstimate {
        double idle_ms = 0;   // the drive idle during the decode
        double wrong_ms = 0;  // reading the wrong guesses, at the bandwidth its reads got
        double gain = 0;      // the right guesses' reads moved into the idle time, less the costs: a share of the decode
    };
    static DecodeEstimate estimate(const DecodeSample & sample);

private:
    DecodeEstimate median() const;  // field by field, over samples_

    Mode mode_;
    std::deque<DecodeEstimate> samples_;  // from decodes without read-ahead, newest last
    bool on_ = false;
    int since_sample_ = 0;  // decodes read ahead since the last sample
};

}  // namespace bmoe::detail
