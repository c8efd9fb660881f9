// One generation in one sequence of the context: what its KV holds, what is still to decode, its sampler and
// what it hands out. A lone generation (Engine::begin/next) is slot 0; --parallel has config.parallel of them.
// Internal: llama.cpp types are fine here.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "bmoe/engine.h"
#include "engine/tokens.h"
#include "llama.h"
#include "policy/ngram_draft.h"

namespace bmoe::detail {

struct Slot {
    bool active = false;
    std::vector<llama_token> pending;     // to decode next: the prompt's rest, or the last sampled token
    std::vector<llama_token> in_context;  // what this sequence's KV holds, position by position
    Sampler sampler;
    bool want_logits = false;
    int n_logprobs = -1;                  // sampling.logprobs of this generation (-1: none)
    bool greedy = true;                   // speculation only where it cannot change the tokens
    int step = 0;                         // tokens handed out so far
    DraftPolicy draft_policy;             // this generation's draft lengths, pauses and give-up
    // Verified by a speculative step, not yet handed out: each token, and what it hands out besides.
    struct Verified {
        llama_token token;
        std::string logits;
        PositionLogprobs logprobs;
    };
    std::deque<Verified> accepted;
    // Why the last decode failed: the generation is over, and the slot refuses to step until it is begun again.
    std::string failure;
};

}  // namespace bmoe::detail
