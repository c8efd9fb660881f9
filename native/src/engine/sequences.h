// One slot of --parallel: a sequence of the context with its own generation (sequences.cpp).
// Internal: llama.cpp types are fine here.
#pragma once

#include <memory>
#include <vector>

#include "llama.h"

namespace bmoe::detail {

struct SamplerChainDeleter {
    void operator()(llama_sampler * s) const { llama_sampler_free(s); }
};

struct Slot {
    bool active = false;
    std::vector<llama_token> pending;     // to decode next: the prompt's rest, or the last sampled token
    std::vector<llama_token> in_context;  // what this sequence's KV holds, position by position
    std::unique_ptr<llama_sampler, SamplerChainDeleter> sampler;
    bool want_logits = false;
    int n_logprobs = -1;
    int step = 0;
};

}  // namespace bmoe::detail
