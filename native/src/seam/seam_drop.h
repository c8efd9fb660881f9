// LOSSY, opt-in (--drop-cold P): the seed project's "cache-aware drop". A routed expert that is
// not resident (a miss: it would have to be read) and carries less than P of its token's routing
// weight is skipped: its slot is pointed at an expert that IS resident and not chosen by that
// token, whose routing probability for that token is set to zero (minus infinity where the model
// takes a softmax over the chosen logits), so the slot adds exactly nothing, and llama.cpp's own
// normalisation spreads the weight over the experts kept. The ids and probabilities are rewritten
// in the graph's tensors after the router ran and before the expert matmuls read them: part of
// the seam. A token's strongest expert is never dropped; with nothing resident to point a slot
// at (the cache off), nothing is dropped.
#pragma once

#include <functional>
#include <vector>

struct ggml_tensor;

namespace bmoe::detail {

class ColdDropper {
public:
    using Resident = std::function<bool(int layer, int expert)>;             // cached or read ahead
    using Cached = std::function<std::vector<int>(int layer)>;               // the layer's cached experts

    ColdDropper(double threshold, Resident resident, Cached cached)
        : threshold_(threshold), resident_(std::move(resident)), cached_(std::move(cached)) {}

    // `topk` is layer `layer`'s computed ffn_moe_topk node; returns the slots dropped.
    int apply(ggml_tensor * topk, int layer);

private:
    double threshold_;
    Resident resident_;
    Cached cached_;
};

}  // namespace bmoe::detail
