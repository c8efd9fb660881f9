// A bounded walk back through a graph node's sources (and the tensor a view looks into): how the
// seam finds what the router computed before its top-k (its input, its probabilities) without
// asking the scheduler to stop there. Bounded, in case llama.cpp's graph is not what it was.
#pragma once

#include <vector>

#include "ggml.h"

namespace bmoe::detail {

// The first node found breadth-first behind `from` (itself included) for which `match` is true,
// within `max_depth` steps; nullptr if none. Leaves (weights, inputs) are not walked into.
// `Tensor` is ggml_tensor or const ggml_tensor: what is found comes back as the caller holds it.
template <typename Tensor, typename Match>
Tensor * find_behind(Tensor * from, int max_depth, Match match) {
    std::vector<Tensor *> frontier{from};
    for (int depth = 0; depth <= max_depth && !frontier.empty(); ++depth) {
        std::vector<Tensor *> next;
        for (Tensor * t : frontier) {
            if (match(t)) {
                return t;
            }
            for (ggml_tensor * s : t->src) {
                if (s != nullptr && s->op != GGML_OP_NONE) {
                    next.push_back(s);
                }
            }
            if (t->view_src != nullptr && t->view_src->op != GGML_OP_NONE) {
                next.push_back(t->view_src);
            }
        }
        frontier.swap(next);
    }
    return nullptr;
}

}  // namespace bmoe::detail
