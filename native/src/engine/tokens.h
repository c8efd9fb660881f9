// What every part of a generation says about tokens: the checks of a caller's ids, a token's text and
// log-probabilities (defined in scoring.cpp, beside the log-softmax scoring shares), the reusable prefix of a
// context, a generation's sampler chain (sampling.cpp), and llama.cpp's exceptions turned into ours. Internal:
// llama.cpp types are fine here.
#pragma once

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "bmoe/engine.h"
#include "bmoe/error.h"
#include "llama.h"

namespace bmoe::detail {

struct SamplerChainDeleter {
    void operator()(llama_sampler * s) const { llama_sampler_free(s); }
};
using Sampler = std::unique_ptr<llama_sampler, SamplerChainDeleter>;

// llama.cpp's C API lets C++ exceptions through (e.g. std::out_of_range from a vocabulary lookup
// of a corrupt model): turn anything but our own error into one, naming what was being done.
template <class F>
auto guarded(const char * what, F && f) -> decltype(f()) {
    try {
        return f();
    } catch (const Error &) {
        throw;
    } catch (const std::exception & e) {
        throw Error(std::string("llama.cpp failed while ") + what + " (" + e.what() +
                    "): the model's metadata or vocabulary is inconsistent (a corrupt file?)");
    }
}

// How much of a sequence's context a new prompt can keep (reuse_kv): their common prefix, less the prompt's last
// token, which is decoded again for its logits.
inline size_t reusable_prefix(const std::vector<llama_token> & in_context, const std::vector<int32_t> & prompt,
                              bool reuse_kv) {
    size_t keep = 0;
    if (reuse_kv) {
        while (keep < in_context.size() && keep < prompt.size() && in_context[keep] == prompt[keep]) {
            ++keep;
        }
        keep = std::min(keep, prompt.size() - 1);
    }
    return keep;
}

// A prompt or a text to score as the caller gave it: not empty, every id in the vocabulary (llama_decode would
// refuse the batch only after the context was touched, and as a failed decode). RequestError otherwise.
void check_tokens(const llama_vocab * vocab, const std::vector<int32_t> & tokens, const char * what);

// The token's bytes as generation hands them out (no special tokens' text).
std::string token_piece(const llama_vocab * vocab, llama_token token);

// The log-probabilities at one position from its raw logits (scoring.cpp): `chosen` and the `n_top` most likely.
PositionLogprobs position_logprobs(const float * logits, const llama_vocab * vocab, llama_token chosen, int n_top);

// A generation's sampler chain (sampling.cpp): its settings, bias and grammar checked first (RequestError), so a
// bad request leaves everything as it was. `n_ctx`: the penalties' window when it is "the whole context".
Sampler sampler_for(const llama_vocab * vocab, int32_t n_ctx, const SamplingParams & sampling,
                    const std::vector<llama_token> & prompt);

}  // namespace bmoe::detail
