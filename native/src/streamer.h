// The streaming policy: given the experts a layer routed to, decide what to read and what to
// evict, and make the routed slices resident before the layer's expert matmuls run. Knows
// nothing of llama.cpp: tensors are (file, offset, bytes per expert) rows.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "expert_cache.h"

namespace bmoe::detail {

class Mirror;
class ReadLanes;
class SliceFile;

// One projection (gate, up, down or fused gate_up) of one layer's experts.
struct StreamedTensor {
    int layer = 0;
    int projection = 0;        // position in the recipe's suffix list: reads go projection-major
    uint32_t file = 0;
    uint64_t offset = 0;       // file offset of expert 0
    uint64_t expert_bytes = 0; // nb[2]: one expert's slice
    int n_expert = 0;
};

struct StreamCounters {
    uint64_t storage_bytes = 0;
    uint64_t slice_bytes = 0;
    uint64_t copy_bytes = 0;
    uint64_t lookups = 0;
    uint64_t hits = 0;
    uint64_t evictions = 0;
    double io_ms = 0;
    double stall_ms = 0;
};

class Streamer {
public:
    Streamer(std::vector<StreamedTensor> tensors, std::vector<SliceFile *> files, std::vector<Mirror *> mirrors,
             uint64_t cache_budget_bytes, ReadLanes & lanes);

    // Serial streaming: returns once every routed slice of `layer` is resident. Throws bmoe::Error
    // if any read failed; then nothing of this layer may be computed.
    void make_resident(int layer, const std::vector<int> & experts);

    StreamCounters take_counters();
    uint64_t resident_expert_bytes() const;
    uint64_t bytes_per_expert(int layer) const;
    int n_layers() const { return static_cast<int>(by_layer_.size()); }

private:
    void for_each_slice(int layer, int expert, bool acquire);

    std::vector<StreamedTensor> tensors_;
    std::vector<std::vector<size_t>> by_layer_;  // layer -> indexes into tensors_, projection order
    std::vector<SliceFile *> files_;
    std::vector<Mirror *> mirrors_;
    ExpertCache cache_;
    ReadLanes & lanes_;
    StreamCounters counters_;
};

}  // namespace bmoe::detail
