// Teacher-forced scoring: what the model (as this engine runs it, lossy knobs included) thinks of
// a given text, token by token. `bench quality` compares a lossy setting with the lossless model
// by the perplexity of the same text; `serve` reports a prompt's logprobs (echo) from it. The
// log-softmax here is also what generation reports as a token's logprob: one formula for both.
#include <algorithm>
#include <cmath>

#include "bmoe/error.h"
#include "engine_impl.h"

namespace bmoe {

namespace detail {

namespace {

TokenLogprob logprob_of(const llama_vocab * vocab, llama_token token, float logprob) {
    TokenLogprob out;
    out.token = token;
    out.logprob = logprob;
    char buf[256];
    const int32_t n = llama_token_to_piece(vocab, token, buf, sizeof(buf), 0, true);
    out.piece.assign(buf, static_cast<size_t>(std::max(n, 0)));
    return out;
}

}  // namespace

PositionLogprobs position_logprobs(const float * logits, const llama_vocab * vocab, llama_token chosen, int n_top) {
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    float top = logits[0];
    for (int32_t v = 1; v < n_vocab; ++v) {
        top = std::max(top, logits[v]);
    }
    double sum = 0;
    for (int32_t v = 0; v < n_vocab; ++v) {
        sum += std::exp(static_cast<double>(logits[v] - top));
    }
    const double log_sum = std::log(sum);
    const auto logprob = [&](llama_token t) { return static_cast<float>(logits[t] - top - log_sum); };
    PositionLogprobs out;
    out.chosen = logprob_of(vocab, chosen, logprob(chosen));
    if (n_top > 0) {
        // The n most likely, highest first, the lower id first among equals: a short sorted list (n <= 20).
        std::vector<llama_token> best;
        const auto before = [&](llama_token a, llama_token b) {
            return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
        };
        for (llama_token v = 0; v < n_vocab; ++v) {
            if (static_cast<int>(best.size()) == n_top && !before(v, best.back())) {
                continue;
            }
            best.insert(std::upper_bound(best.begin(), best.end(), v, before), v);
            if (static_cast<int>(best.size()) > n_top) {
                best.pop_back();
            }
        }
        for (const llama_token t : best) {
            out.top.push_back(logprob_of(vocab, t, logprob(t)));
        }
    }
    return out;
}

}  // namespace detail

std::vector<PositionLogprobs> Engine::score_positions(const std::vector<int32_t> & tokens, int n_top) {
    Impl & d = live();
    if (tokens.size() < 2) {
        throw Error("scoring needs a text of at least two tokens");
    }
    if (tokens.size() > static_cast<size_t>(d.config.ctx)) {
        throw Error("the text to score has " + std::to_string(tokens.size()) + " tokens, more than the context (" +
                    std::to_string(d.config.ctx) + "): shorten it or raise --ctx");
    }
    const int32_t n_vocab = llama_vocab_n_tokens(d.vocab);
    for (const int32_t t : tokens) {
        if (t < 0 || t >= n_vocab) {
            throw Error("token id " + std::to_string(t) + " is outside the vocabulary");
        }
    }
    d.gguf->check_unchanged();
    llama_memory_clear(llama_get_memory(d.ctx.get()), true);
    d.forget_slots();
    d.in_context.clear();
    d.pending.clear();
    d.accepted.clear();
    d.accepted_outputs.clear();
    std::vector<PositionLogprobs> out;
    out.reserve(tokens.size() - 1);
    for (size_t first = 0; first + 1 < tokens.size(); ++first) {
        // One token per decode, as in generation: what a lossy knob does depends on the batch (a
        // batch routes to more experts, so --drop-cold would find fewer cold ones).
        std::vector<llama_token> chunk(1, tokens[first]);
        d.decode(chunk, true);
        const float * logits = llama_get_logits_ith(d.ctx.get(), 0);
        out.push_back(detail::position_logprobs(logits, d.vocab, tokens[first + 1], n_top));
    }
    return out;
}

std::vector<float> Engine::score(const std::vector<int32_t> & tokens) {
    std::vector<float> out;
    for (const PositionLogprobs & p : score_positions(tokens, 0)) {
        out.push_back(p.chosen.logprob);
    }
    return out;
}

int32_t Engine::vocab_size() const { return llama_vocab_n_tokens(live().vocab); }

}  // namespace bmoe
