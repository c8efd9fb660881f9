// Teacher-forced scoring: what the model (as this engine runs it, lossy knobs included) thinks of
// a given text, token by token. `bench quality` compares a lossy setting with the lossless model
// by the perplexity of the same text.
#include <cmath>

#include "bmoe/error.h"
#include "engine_impl.h"

namespace bmoe {

std::vector<float> Engine::score(const std::vector<int32_t> & tokens) {
    Impl & d = live();
    if (tokens.size() < 2) {
        throw Error("scoring needs a text of at least two tokens");
    }
    if (tokens.size() > static_cast<size_t>(d.config.ctx)) {
        throw Error("the text to score has " + std::to_string(tokens.size()) + " tokens, more than the context (" +
                    std::to_string(d.config.ctx) + "): shorten it or raise --ctx");
    }
    d.gguf->check_unchanged();
    llama_memory_clear(llama_get_memory(d.ctx.get()), true);
    d.in_context.clear();
    d.pending.clear();
    d.accepted.clear();
    d.accepted_logits.clear();
    const int32_t n_vocab = llama_vocab_n_tokens(d.vocab);
    std::vector<float> out;
    out.reserve(tokens.size() - 1);
    for (size_t first = 0; first + 1 < tokens.size();) {
        // One token per decode, as in generation: what a lossy knob does depends on the batch (a
        // batch routes to more experts, so --drop-cold would find fewer cold ones).
        const size_t n = 1;
        std::vector<llama_token> chunk(tokens.begin() + static_cast<long>(first),
                                       tokens.begin() + static_cast<long>(first + n));
        d.decode(chunk, true);
        for (size_t i = 0; i < n; ++i) {
            const float * logits = llama_get_logits_ith(d.ctx.get(), static_cast<int32_t>(i));
            const int32_t next = tokens[first + i + 1];
            if (next < 0 || next >= n_vocab) {
                throw Error("token id " + std::to_string(next) + " is outside the vocabulary");
            }
            float top = logits[0];
            for (int32_t v = 1; v < n_vocab; ++v) {
                top = std::max(top, logits[v]);
            }
            double sum = 0;
            for (int32_t v = 0; v < n_vocab; ++v) {
                sum += std::exp(static_cast<double>(logits[v] - top));
            }
            out.push_back(static_cast<float>(logits[next] - top - std::log(sum)));
        }
        first += n;
    }
    return out;
}

}  // namespace bmoe
