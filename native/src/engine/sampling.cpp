// The sampler chain of a generation (detail::sampler_for): the grammar first (lazy
// with triggers, or holding from the first token with the template's opening fed in), then logit bias and
// penalties, then greedy or top-k/top-p/min-p/temperature/dist, as llama.cpp's common sampler orders them.
#include <exception>
#include <string>
#include <vector>

#include "bmoe/error.h"
#include "engine/tokens.h"

namespace bmoe {

namespace {

// The grammar's sampler: lazy (free text until one of its triggers appears: a tool call's opening), or
// holding from the first token with its prefill fed in first, as common_sampler_init does for a chat
// format's grammar (which starts with the assistant turn's opening that the template already wrote).
std::string piece_of(const llama_vocab * vocab, llama_token t) {
    char buf[256];
    const int32_t n = llama_token_to_piece(vocab, t, buf, sizeof(buf), 0, true);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

std::vector<llama_token> tokenized(const llama_vocab * vocab, const std::string & text) {
    std::vector<llama_token> tokens(text.size() + 8);
    const int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), tokens.data(),
                                     static_cast<int32_t>(tokens.size()), false, true);
    tokens.resize(n < 0 ? 0 : static_cast<size_t>(n));
    return tokens;
}

// Tokens whose pieces spell `text` exactly, for the grammar (which reads pieces, not ids): the prompt's
// own last tokens when they end exactly on it (what the model saw), else `text` tokenized alone, else after
// a line break (a tokenizer that puts a space before the first word, e.g. SPM's, puts it before the break,
// which is dropped). Empty when none spells it.
std::vector<llama_token> prefill_tokens(const llama_vocab * vocab, const std::vector<int32_t> & prompt,
                                        const std::string & text) {
    std::string tail;
    for (size_t k = 1; k <= prompt.size() && tail.size() < text.size(); ++k) {
        tail = piece_of(vocab, prompt[prompt.size() - k]) + tail;
        if (tail == text) {
            return {prompt.end() - static_cast<long>(k), prompt.end()};
        }
    }
    std::vector<llama_token> tokens = tokenized(vocab, text);
    std::string spelled;
    for (llama_token t : tokens) {
        spelled += piece_of(vocab, t);
    }
    if (spelled == text) {
        return tokens;
    }
    tokens = tokenized(vocab, "\n" + text);
    spelled.clear();
    for (size_t i = 0; i < tokens.size(); ++i) {
        spelled += piece_of(vocab, tokens[i]);
        if (!spelled.empty() && spelled.back() == '\n' && spelled.find_first_not_of(" \n") == std::string::npos) {
            std::vector<llama_token> rest(tokens.begin() + static_cast<long>(i) + 1, tokens.end());
            std::string again;
            for (llama_token t : rest) {
                again += piece_of(vocab, t);
            }
            if (again == text) {
                return rest;
            }
            break;
        }
    }
    // Byte by byte (text a tokenizer rewrites, e.g. SPM's "▁", which it reads as a space): the tokens whose
    // piece is one byte, which byte-fallback and byte-level vocabularies have for every byte.
    std::vector<llama_token> by_byte(256, LLAMA_TOKEN_NULL);
    for (llama_token t = llama_vocab_n_tokens(vocab) - 1; t >= 0; --t) {
        const std::string piece = piece_of(vocab, t);
        if (piece.size() == 1) {
            by_byte[static_cast<unsigned char>(piece[0])] = t;
        }
    }
    tokens.clear();
    for (char c : text) {
        const llama_token t = by_byte[static_cast<unsigned char>(c)];
        if (t == LLAMA_TOKEN_NULL) {
            return {};
        }
        tokens.push_back(t);
    }
    return tokens;
}

llama_sampler * grammar_sampler(const llama_vocab * vocab, const SamplingParams & s,
                                const std::vector<int32_t> & prompt) {
    std::vector<std::string> patterns;
    for (size_t at = 0; at <= s.grammar_triggers.size();) {
        size_t end = s.grammar_triggers.find('\n', at);
        end = end == std::string::npos ? s.grammar_triggers.size() : end;
        if (end > at) {
            patterns.push_back(s.grammar_triggers.substr(at, end - at));
        }
        at = end + 1;
    }
    if (!patterns.empty()) {
        std::vector<const char *> c_patterns;
        for (const std::string & p : patterns) {
            c_patterns.push_back(p.c_str());
        }
        try {  // llama.cpp compiles each trigger as a std::regex, which throws on one that is not
            return llama_sampler_init_grammar_lazy_patterns(vocab, s.grammar.c_str(), "root", c_patterns.data(),
                                                            c_patterns.size(), nullptr, 0);
        } catch (const std::exception & e) {
            throw RequestError(std::string("the grammar's triggers are not regular expressions: ") + e.what());
        }
    }
    llama_sampler * g = llama_sampler_init_grammar(vocab, s.grammar.c_str(), "root");
    if (g == nullptr || s.grammar_prefill.empty()) {
        return g;
    }
    const std::vector<llama_token> tokens = prefill_tokens(vocab, prompt, s.grammar_prefill);
    if (tokens.empty()) {
        llama_sampler_free(g);
        throw RequestError("the grammar's prefill (the template's opening) cannot be spelled in this model's tokens");
    }
    try {
        for (llama_token t : tokens) {
            llama_sampler_accept(g, t);
        }
    } catch (const std::exception & e) {
        llama_sampler_free(g);
        throw RequestError(std::string("the grammar does not parse its prefill (the template's opening): ") +
                           e.what());
    }
    return g;
}

// The sampler's settings and bias: a request's (check_settings and parse_logit_bias throw a plain Error, shared
// with the engine's own settings).
void check_request(const SamplingParams & sampling, int32_t n_vocab) {
    try {
        check_settings(sampling);
        for (const auto & [token, bias] : parse_logit_bias(sampling.logit_bias)) {
            if (token >= n_vocab) {
                throw Error("logit_bias names token " + std::to_string(token) + ", outside the vocabulary (0 to " +
                            std::to_string(n_vocab - 1) + ")");
            }
        }
    } catch (const Error & e) {
        throw RequestError(e.what());
    }
}

detail::Sampler build_sampler(const llama_vocab * vocab, int32_t n_ctx, const SamplingParams & sampling,
                              detail::Sampler grammar, const std::vector<llama_token> & prompt) {
    llama_sampler_chain_params chain_params = llama_sampler_chain_default_params();
    chain_params.no_perf = true;
    detail::Sampler sampler(llama_sampler_chain_init(chain_params));
    llama_sampler * chain = sampler.get();
    if (grammar) {  // first: the samplers after it choose among the tokens it allows
        llama_sampler_chain_add(chain, grammar.release());
    }
    // Then, as in llama.cpp's common sampler, the bias and the penalties before anything chooses (greedy
    // included). Each only when asked for: the default chain is the one the gates check.
    if (!sampling.logit_bias.empty()) {
        std::vector<llama_logit_bias> biases;
        for (const auto & [token, bias] : parse_logit_bias(sampling.logit_bias)) {
            biases.push_back({token, bias});
        }
        const auto n = static_cast<int32_t>(biases.size());
        llama_sampler_chain_add(chain, llama_sampler_init_logit_bias(llama_vocab_n_tokens(vocab), n, biases.data()));
    }
    const bool penalised = sampling.repeat_penalty != 1 || sampling.presence_penalty != 0 ||
                           sampling.frequency_penalty != 0;
    if (penalised && sampling.penalty_last_n != 0) {
        const int32_t window = sampling.penalty_last_n < 0 ? n_ctx : sampling.penalty_last_n;
        llama_sampler * penalties = llama_sampler_init_penalties(
            llama_vocab_n_tokens(vocab), window, static_cast<float>(sampling.repeat_penalty),
            static_cast<float>(sampling.frequency_penalty), static_cast<float>(sampling.presence_penalty));
        // The prompt's tokens count, as in llama-server: repeating the prompt is repeating. (The chain then
        // accepts each sampled token itself.)
        const auto last = static_cast<size_t>(window);
        for (size_t i = prompt.size() > last ? prompt.size() - last : 0; i < prompt.size(); ++i) {
            llama_sampler_accept(penalties, prompt[i]);
        }
        llama_sampler_chain_add(chain, penalties);
    }
    if (sampling.temp <= 0) {
        llama_sampler_chain_add(chain, llama_sampler_init_greedy());
        return sampler;
    }
    if (sampling.top_k > 0) {
        llama_sampler_chain_add(chain, llama_sampler_init_top_k(sampling.top_k));
    }
    llama_sampler_chain_add(chain, llama_sampler_init_top_p(static_cast<float>(sampling.top_p), 1));
    if (sampling.min_p > 0) {
        llama_sampler_chain_add(chain, llama_sampler_init_min_p(static_cast<float>(sampling.min_p), 1));
    }
    llama_sampler_chain_add(chain, llama_sampler_init_temp(static_cast<float>(sampling.temp)));
    // auto: a fresh seed each generation (llama.cpp's LLAMA_DEFAULT_SEED asks it for a random one)
    const uint32_t seed = sampling.seed == kAuto ? LLAMA_DEFAULT_SEED : static_cast<uint32_t>(sampling.seed);
    llama_sampler_chain_add(chain, llama_sampler_init_dist(seed));
    return sampler;
}
}  // namespace

detail::Sampler detail::sampler_for(const llama_vocab * vocab, int32_t n_ctx, const SamplingParams & sampling,
                                    const std::vector<llama_token> & prompt) {
    check_request(sampling, llama_vocab_n_tokens(vocab));
    detail::Sampler grammar;
    if (!sampling.grammar.empty()) {
        grammar.reset(grammar_sampler(vocab, sampling, prompt));
        if (!grammar) {
            throw RequestError("the grammar does not parse (GBNF with a `root` rule)");
        }
    }
    return build_sampler(vocab, n_ctx, sampling, std::move(grammar), prompt);
}

}  // namespace bmoe
