#include "seam/seam_predict.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "ggml-cpu.h"
#include "model/expert_names.h"
#include "ggml.h"
#include "seam/seam_graph.h"

namespace bmoe::detail {
namespace {

// "blk.<il>.<rest>" -> il, or -1.
int layer_of(const std::string & name, const char * rest) {
    size_t at = 0;
    const int il = block_of(name, &at);
    return il >= 0 && name.compare(at, std::string::npos, rest) == 0 ? il : -1;
}

bool is_f32_vector(const ggml_tensor * t, int64_t n) {
    return t != nullptr && t->type == GGML_TYPE_F32 && t->ne[0] == n && t->nb[0] == sizeof(float);
}

}  // namespace

NextLayerPredictor::NextLayerPredictor(const std::vector<CapturedTensor> & captured) {
    auto slot = [&](int il) -> Router & {
        if (il >= static_cast<int>(routers_.size())) {
            routers_.resize(static_cast<size_t>(il) + 1);
        }
        return routers_[static_cast<size_t>(il)];
    };
    for (const CapturedTensor & c : captured) {
        if (!c.host) {
            continue;  // a layer placed on an RPC worker: its router's bytes are not in this process
        }
        int il = -1;
        if ((il = layer_of(c.name, "ffn_gate_inp.weight")) >= 0) {
            slot(il).weight = c.tensor;
        } else if ((il = layer_of(c.name, "ffn_gate_inp.bias")) >= 0) {
            slot(il).bias = c.tensor;
        } else if ((il = layer_of(c.name, "exp_probs_b.bias")) >= 0) {
            slot(il).probs_bias = c.tensor;
        }
    }
}

bool NextLayerPredictor::any() const {
    for (size_t il = 0; il + 1 < routers_.size(); ++il) {
        if (routers_[il].weight != nullptr && routers_[il + 1].weight != nullptr) {
            return true;
        }
    }
    return false;
}

const ggml_tensor * NextLayerPredictor::router_input(const ggml_tensor * topk, const ggml_tensor * weight) const {
    // topk <- argsort <- [biased/masked] probs <- softmax|sigmoid <- [+bias] <- mul_mat(weight, x)
    const ggml_tensor * logits = find_behind(topk, 12, [&](const ggml_tensor * t) {
        return t->op == GGML_OP_MUL_MAT && t->src[0] == weight;
    });
    return logits != nullptr ? logits->src[1] : nullptr;
}

bool NextLayerPredictor::predict(const ggml_tensor * topk, int layer, std::vector<int> & out, int max_tokens) {
    out.clear();
    const int next = layer + 1;
    if (layer < 0 || next >= static_cast<int>(routers_.size()) || routers_[static_cast<size_t>(layer)].weight == nullptr ||
        routers_[static_cast<size_t>(next)].weight == nullptr) {
        return false;
    }
    const Router & r = routers_[static_cast<size_t>(next)];
    const ggml_tensor * w = r.weight;
    const int64_t n_embd = w->ne[0];
    const int64_t n_expert = w->ne[1];
    const ggml_tensor * x = router_input(topk, routers_[static_cast<size_t>(layer)].weight);
    if (x == nullptr || x->data == nullptr || !is_f32_vector(x, n_embd) || topk->ne[0] > n_expert) {
        return false;
    }
    const auto * traits = ggml_get_type_traits_cpu(w->type);
    if (traits == nullptr || traits->vec_dot == nullptr) {
        return false;
    }
    const bool convert = traits->vec_dot_type != GGML_TYPE_F32;
    const auto * dot_traits = ggml_get_type_traits_cpu(traits->vec_dot_type);
    if (convert && (dot_traits == nullptr || dot_traits->from_float == nullptr)) {
        return false;
    }
    const bool with_bias = is_f32_vector(r.bias, n_expert);
    const bool with_probs_bias = is_f32_vector(r.probs_bias, n_expert);
    const int k = static_cast<int>(topk->ne[0]);
    const int64_t n_tokens = std::min<int64_t>(x->ne[1], max_tokens);
    scores_.resize(static_cast<size_t>(n_expert));
    order_.resize(static_cast<size_t>(n_expert));
    for (int64_t t = 0; t < n_tokens; ++t) {
        const auto * row = reinterpret_cast<const float *>(static_cast<const char *>(x->data) + t * x->nb[1]);
        const void * input = row;
        if (convert) {
            quantized_.resize(ggml_row_size(traits->vec_dot_type, n_embd));
            dot_traits->from_float(row, quantized_.data(), n_embd);
            input = quantized_.data();
        }
        for (int64_t j = 0; j < n_expert; ++j) {
            float s = 0;
            traits->vec_dot(static_cast<int>(n_embd), &s, 0, static_cast<const char *>(w->data) + j * w->nb[1], 0, input,
                            0, 1);
            if (with_bias) {
                s += static_cast<const float *>(r.bias->data)[j];
            }
            if (with_probs_bias) {
                s = 1.0f / (1.0f + std::exp(-s)) + static_cast<const float *>(r.probs_bias->data)[j];
            }
            scores_[static_cast<size_t>(j)] = s;
        }
        for (int64_t j = 0; j < n_expert; ++j) {
            order_[static_cast<size_t>(j)] = static_cast<int>(j);
        }
        std::partial_sort(order_.begin(), order_.begin() + k, order_.end(),
                          [&](int a, int b) { return scores_[static_cast<size_t>(a)] > scores_[static_cast<size_t>(b)]; });
        out.insert(out.end(), order_.begin(), order_.begin() + k);
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return !out.empty();
}

}  // namespace bmoe::detail
