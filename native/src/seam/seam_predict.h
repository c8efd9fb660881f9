// The seam's read-ahead half: guess the next layer's experts before its router runs ("stale
// gate"): layer l+1's router weights applied to layer l's router input, which the graph has
// computed when layer l's top-k is observed. The residual stream changes little from one layer to
// the next, so the guess is often right; when it is wrong, only bandwidth is lost (the real
// router still decides what is computed). Touches ggml_tensor internals: part of the seam.
#pragma once

#include <cstdint>
#include <vector>

#include "seam/seam.h"

struct ggml_tensor;

namespace bmoe::detail {

class NextLayerPredictor {
public:
    // The routers found among the captured weights: blk.N.ffn_gate_inp.weight, with the optional
    // blk.N.ffn_gate_inp.bias and blk.N.exp_probs_b.bias (selection bias after a sigmoid).
    explicit NextLayerPredictor(const std::vector<CapturedTensor> & captured);

    // `topk` is layer `layer`'s computed ffn_moe_topk node. Fills `out` with the experts layer
    // layer+1 would route the batch's tokens to (their union; at most `max_tokens` tokens are
    // looked at); false when there is no guess (no router there, a graph of another shape).
    bool predict(const ggml_tensor * topk, int layer, std::vector<int> & out, int max_tokens = 4);
    // Whether any layer has a router and so does the next one.
    bool any() const;

private:
    struct Router {
        const ggml_tensor * weight = nullptr;
        const ggml_tensor * bias = nullptr;        // added to the logits
        const ggml_tensor * probs_bias = nullptr;  // added to sigmoid(logits) for the choice
    };
    const ggml_tensor * router_input(const ggml_tensor * topk, const ggml_tensor * weight) const;

    std::vector<Router> routers_;  // by layer
    std::vector<float> scores_;
    std::vector<char> quantized_;  // the input row in the weight's dot-product type
    std::vector<int> order_;
};

}  // namespace bmoe::detail
