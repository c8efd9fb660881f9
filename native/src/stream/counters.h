// What the streamer did since the last take: the counters each step's metrics are made of (streaming.cpp).
#pragma once

#include <cstdint>

namespace bmoe::detail {

struct StreamCounters {
    uint64_t storage_bytes = 0;
    uint64_t slice_bytes = 0;
    uint64_t copy_bytes = 0;
    uint64_t lookups = 0;
    uint64_t hits = 0;
    uint64_t evictions = 0;
    uint64_t rereads = 0;  // slices read twice because the first read failed its checksum
    double io_ms = 0;
    double convert_ms = 0;  // lanes converting slices to the kernels' layout (--repack), summed
    double stall_ms = 0;  // serial: eval thread blocked; overlap: per compute thread, averaged
    double drain_ms = 0;  // overlap: waiting for the previous layer's reads before publishing
    // Read-ahead: experts guessed for a layer before its router ran, how many it chose, the bytes read for
    // guesses (all / those it did not choose), and the guessed experts not cached (read ahead or only counted):
    uint64_t predicted = 0;
    uint64_t predicted_correct = 0;
    uint64_t ahead_bytes = 0;
    uint64_t ahead_wasted_bytes = 0;
    uint64_t guessed_bytes = 0;
    uint64_t guessed_wasted_bytes = 0;
    // The bytes of the distinct experts routed since the last take (a prompt's ubatches route to
    // the same experts again: what one read of each would cost).
    uint64_t routed_bytes = 0;
};

}  // namespace bmoe::detail
