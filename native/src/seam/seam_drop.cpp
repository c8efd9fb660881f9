#include "seam/seam_drop.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "ggml.h"
#include "seam/seam_graph.h"

namespace bmoe::detail {
namespace {

// The router's probabilities behind the top-k node: the node named ffn_moe_probs-<il> (a softmax
// or sigmoid output; the logits themselves where the model takes a softmax over the chosen ones).
ggml_tensor * probs_of(ggml_tensor * topk, int layer) {
    const std::string name = "ffn_moe_probs-" + std::to_string(layer);
    return find_behind(topk, 8, [&](const ggml_tensor * t) { return name == t->name; });
}

}  // namespace

int ColdDropper::apply(ggml_tensor * topk, int layer) {
    ggml_tensor * probs = probs_of(topk, layer);
    if (probs == nullptr || probs->type != GGML_TYPE_F32 || probs->nb[0] != sizeof(float) || topk->type != GGML_TYPE_I32 ||
        probs->ne[1] != topk->ne[1]) {
        return 0;  // a graph of another shape: drop nothing rather than guess
    }
    // Logits (the model's softmax comes after the choice): a slot is silenced with -inf, not 0.
    const bool logits = probs->op != GGML_OP_SOFT_MAX && probs->op != GGML_OP_UNARY;
    const int k = static_cast<int>(topk->ne[0]);
    const int64_t n_expert = probs->ne[0];
    auto id_at = [&](int64_t t, int j) -> int32_t & {
        return *reinterpret_cast<int32_t *>(static_cast<char *>(topk->data) + t * topk->nb[1] + j * topk->nb[0]);
    };
    auto prob_row = [&](int64_t t) { return reinterpret_cast<float *>(static_cast<char *>(probs->data) + t * probs->nb[1]); };

    // Pass 1: the candidates (cold and light); everything else is kept and will be resident.
    std::vector<std::pair<int64_t, int>> candidates;
    std::vector<int> kept;
    std::vector<float> share(static_cast<size_t>(k));
    for (int64_t t = 0; t < topk->ne[1]; ++t) {
        const float * p = prob_row(t);
        double total = 0;
        const float top = p[id_at(t, 0)];
        for (int j = 0; j < k; ++j) {
            const int32_t e = id_at(t, j);
            if (e < 0 || e >= n_expert) {
                return 0;  // the streamer refuses such ids with a message; do not index with them
            }
            share[static_cast<size_t>(j)] = logits ? std::exp(p[e] - top) : p[e];
            total += share[static_cast<size_t>(j)];
        }
        for (int j = 0; j < k; ++j) {
            const int e = id_at(t, j);
            const bool light = total > 0 && share[static_cast<size_t>(j)] / total < threshold_;
            if (j > 0 && light && !resident_(layer, e)) {  // slot 0 is the token's strongest
                candidates.emplace_back(t, j);
            } else {
                kept.push_back(e);
            }
        }
    }
    if (candidates.empty()) {
        return 0;
    }
    std::sort(kept.begin(), kept.end());
    const std::vector<int> cached = cached_(layer);
    int dropped = 0;
    std::vector<double> lost(static_cast<size_t>(topk->ne[1]), 0.0);  // per token: the probability dropped
    for (const auto & [t, j] : candidates) {
        const int e = id_at(t, j);
        if (std::binary_search(kept.begin(), kept.end(), e)) {
            continue;  // another slot keeps it: it is read anyway
        }
        // A stand-in: resident, and not one of this token's own choices.
        int stand_in = -1;
        for (int c : cached) {
            bool chosen = false;
            for (int i = 0; i < k && !chosen; ++i) {
                chosen = id_at(t, i) == c;
            }
            if (!chosen) {
                stand_in = c;
                break;
            }
        }
        if (stand_in < 0) {
            continue;  // nothing resident to point the slot at: read it as routed
        }
        float * p = prob_row(t);
        lost[static_cast<size_t>(t)] += logits ? 0.0 : p[e];
        id_at(t, j) = stand_in;
        p[stand_in] = logits ? -INFINITY : 0.0f;
        ++dropped;
    }
    // Renormalise: the kept experts of a token share its whole routing weight again (models that
    // normalise the chosen weights anyway are unchanged by a common factor; a softmax over the
    // chosen logits renormalises by itself).
    for (int64_t t = 0; t < topk->ne[1]; ++t) {
        if (lost[static_cast<size_t>(t)] <= 0) {
            continue;
        }
        float * p = prob_row(t);
        double total = 0;
        for (int j = 0; j < k; ++j) {
            total += p[id_at(t, j)];  // stand-ins count 0
        }
        const double scale = (total + lost[static_cast<size_t>(t)]) / total;
        for (int j = 0; j < k; ++j) {
            p[id_at(t, j)] = static_cast<float>(p[id_at(t, j)] * scale);
        }
    }
    return dropped;
}

}  // namespace bmoe::detail
