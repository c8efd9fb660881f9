// Teacher-forced scoring: what the model (as this engine runs it, lossy knobs included) thinks of
// a given text, token by token. `bench quality` compares a lossy setting with the lossless model
// by the perplexity of the same text; `serve` reports a prompt's logprobs (echo) from it. The
// log-softmax here is also what generation reports as a token's logprob: one formula for both.
#include <algorithm>
#include <cmath>

#include "bmoe/error.h"
#include "engine/context.h"
#include "engine/tokens.h"
#include "model/llama_runtime.h"

namespace bmoe::detail {

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

namespace {

// What one batched decode of scoring may ask logits for: each position's are the whole vocabulary, and llama.cpp
// keeps its output buffer at the largest size a context ever asked for (Qwen3's 151,936 tokens: 0.6 MiB a
// position, so a 512-token batch would leave 311 MiB behind). 16 MiB: 27 positions of Qwen3's, 131 of a
// 32,000-token vocabulary's; a batch that size already reads each routed expert once for all its tokens.
constexpr uint64_t kScoreLogitsBytes = 16ull << 20;

}  // namespace

int32_t Context::score_batch() const {
    const auto per_position = static_cast<uint64_t>(llama_vocab_n_tokens(model_.vocab())) * sizeof(float);
    const auto by_logits = static_cast<int32_t>(std::max<uint64_t>(1, kScoreLogitsBytes / per_position));
    return std::min(batch_per_call(), by_logits);
}

std::vector<PositionLogprobs> Context::score(const std::vector<int32_t> & tokens, int n_top, int32_t first,
                                             int32_t count, bool batched, std::vector<llama_token> & in_context,
                                             const std::function<void()> & start_afresh) {
    const llama_vocab * vocab = model_.vocab();
    // The text is the request's: what is wrong with it is its fault, not the engine's.
    if (tokens.size() < 2) {
        throw RequestError("scoring needs a text of at least two tokens");
    }
    if (tokens.size() > static_cast<size_t>(config_.ctx)) {
        throw RequestError("the text to score has " + std::to_string(tokens.size()) +
                           " tokens, more than the context (" + std::to_string(config_.ctx) +
                           "): shorten it or raise --ctx");
    }
    check_tokens(vocab, tokens, "the text to score");
    const auto scored = static_cast<int32_t>(tokens.size() - 1);  // the last token predicts nothing
    if (first < 0 || first >= scored || count < 1) {
        throw Error("scoring positions from " + std::to_string(first) + " (" + std::to_string(count) +
                    " of them): a text of " + std::to_string(tokens.size()) + " tokens has positions 0 to " +
                    std::to_string(scored - 1));
    }
    count = std::min(count, scored - first);
    file_.gguf().check_unchanged();
    if (first == 0) {
        start_afresh();
    } else if ((in_context.size() != static_cast<size_t>(first) ||
                      !std::equal(in_context.begin(), in_context.end(), tokens.begin()))) {
        // Something else used the context since the last chunk (or that chunk failed and cleared it).
        throw Error("the context does not hold the text's first " + std::to_string(first) +
                    " tokens any more: score it again from position 0");
    }
    std::vector<PositionLogprobs> out;
    out.reserve(static_cast<size_t>(count));
    // Batched: up to score_batch() positions a decode, logits for each. Otherwise one token per decode, as in
    // generation: what a lossy knob does depends on the batch (a batch routes to more experts, so --drop-cold
    // would find fewer cold ones), and `bench quality` measures the knob as generation runs it.
    const int32_t per_decode = batched ? score_batch() : 1;
    for (int32_t at = first; at < first + count;) {
        const int32_t n = std::min(per_decode, first + count - at);
        std::vector<BatchEntry> chunk;
        for (int32_t i = 0; i < n; ++i) {
            chunk.push_back({tokens[static_cast<size_t>(at + i)], at + i, 0, true});
        }
        // A batch writes compute buffers sized for it that no decode after it needs, as a prompt's does.
        const bool prompt = n > 1 && streaming_.on() && streaming_.memory() && !file_.rpc();
        if (prompt) {
            streaming_.make_room_for_prompt(n, 1, prompt_ubatch_);
        }
        try {
            const BatchThreads threads = threads_for(static_cast<size_t>(n));
            decode(chunk, [&](size_t done, int called) {
                in_context.insert(in_context.end(), tokens.begin() + at + static_cast<long>(done),
                                  tokens.begin() + at + static_cast<long>(done) + called);
            });
        } catch (...) {
            clear();  // keys and values nobody can vouch for
            in_context.clear();
            throw;
        }
        if (prompt) {
            streaming_.give_prompt_memory_back();
        }
        for (int32_t i = 0; i < n; ++i) {
            out.push_back(position_logprobs(logits(i), vocab, tokens[static_cast<size_t>(at + i) + 1], n_top));
        }
        at += n;
    }
    return out;
}

void check_tokens(const llama_vocab * vocab, const std::vector<int32_t> & tokens, const char * what) {
    if (tokens.empty()) {
        throw RequestError(std::string(what) + " is empty");
    }
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    for (const int32_t t : tokens) {
        if (t < 0 || t >= n_vocab) {
            throw RequestError(std::string(what) + " has token id " + std::to_string(t) +
                               ", outside the vocabulary (0 to " + std::to_string(n_vocab - 1) + ")");
        }
    }
}

std::string token_piece(const llama_vocab * vocab, llama_token token) {
    char buf[256];
    const int32_t n = llama_token_to_piece(vocab, token, buf, sizeof(buf), 0, false);
    return {buf, static_cast<size_t>(std::max(n, 0))};
}

}  // namespace bmoe::detail
