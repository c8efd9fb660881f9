// The engine: one model, one context, expert streaming on or off. A generation is begun with a
// prompt and advanced one token at a time, so callers can stream text and stop whenever.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bmoe/config.h"
#include "bmoe/metrics.h"

namespace bmoe {

namespace detail {
class Model;
}

// A token and its natural log-probability at one position: the log-softmax of that position's raw
// logits (the model's own distribution, before logit bias, penalties, grammar or temperature).
struct TokenLogprob {
    int32_t token = -1;
    float logprob = 0;
    std::string piece;  // the token's bytes (may be part of a UTF-8 character)
};

// One position: the token there first, then the `n` most likely tokens (highest first, ties by id).
struct PositionLogprobs {
    TokenLogprob chosen;
    std::vector<TokenLogprob> top;
};

struct StepResult {
    int32_t token = -1;
    std::string piece;
    bool end_of_generation = false;  // the model emitted an end-of-generation token
    TokenMetrics metrics;
    std::string logits;  // raw float32 logits of this step (n_vocab * 4 bytes) when requested
    // With sampling.logprobs >= 0: the chosen token's log-probability and the most likely tokens, from the
    // same logits the sampler saw (with speculation: the verified position's). chosen.token is -1 otherwise.
    PositionLogprobs logprobs;
};

// One slot's share of a batched step (Engine::step_slots): its token, or only a prompt chunk taken in.
struct SlotStep {
    int32_t slot = -1;
    bool produced = false;       // a token was sampled (false: a chunk of its prompt went in, no token yet)
    bool context_full = false;   // the slot's context has no room for its next tokens: its generation is over
    StepResult result;           // when produced; result.metrics are the whole step's
};

// One batched step: one llama_decode holding the next token of every decoding slot and up to
// prefill_chunk tokens of prompts.
struct BatchStep {
    std::vector<SlotStep> slots;
    TokenMetrics metrics;        // the step's: n_tokens is the batch, routed_bytes the union of its experts
    int n_sequences = 0;         // slots in the batch
    int n_decoding = 0;          // ... of which decoded one token (the others took a prompt chunk)
    // What the decoding slots would have read each alone: one token routes to n_expert_used distinct experts
    // per layer, so n_decoding tokens' worth (0 on a step with a prompt chunk: a chunk's own union is not kept).
    uint64_t summed_bytes = 0;
};

// True while an engine of this process overlaps reads with compute: the expert-ready hook is
// process-wide, so a second engine must run serial (the default "overlap when possible" asks this).
bool overlap_in_use();

class Engine {
public:
    // Throws bmoe::Error with a one-line message for every expected failure (bad file, unknown
    // architecture with streaming, dense model with streaming, invalid configuration, ...).
    Engine(const std::string & model_path, const StreamConfig & config);
    ~Engine();
    Engine(const Engine &) = delete;
    Engine & operator=(const Engine &) = delete;

    const RunInfo & run_info() const;
    // `parse_special`: text such as "<|im_end|>" becomes that control token (for rendered templates);
    // off, it is plain text (for whatever a user typed).
    std::vector<int32_t> tokenize(const std::string & text, bool add_special, bool parse_special = true) const;
    std::string detokenize(const std::vector<int32_t> & tokens) const;

    // Start a generation. Without `reuse_kv` the KV cache is cleared; with it, the longest common
    // prefix of `prompt` and the tokens the context already holds stays and only the rest is decoded
    // (a conversation's next turn). Returns how many prompt tokens were reused. The expert cache is
    // kept either way.
    int32_t begin(const std::vector<int32_t> & prompt, const SamplingParams & sampling, bool want_logits,
                  bool reuse_kv = false);
    // Decode the pending tokens and sample the next one. False when nothing is pending (end of
    // generation reached before) or the context is full. Throws bmoe::Error on a failed read.
    bool next(StepResult & out);

    // Teacher-forced: the natural log-probability of each token after the ones before it (one
    // value per token from the second on), one token per decode as in generation. Clears the
    // context first. For perplexity.
    std::vector<float> score(const std::vector<int32_t> & tokens);
    // The same pass, each position with its `n_top` most likely tokens too (echo + logprobs of a prompt).
    std::vector<PositionLogprobs> score_positions(const std::vector<int32_t> & tokens, int n_top);
    // ... in chunks a caller can stop between (a client that hung up): positions `first` to first+count-1 (each
    // predicting the token after it; count is cut at the text's last but one). first == 0 clears the context;
    // otherwise it must hold exactly tokens[:first], the chunks before (checked: bmoe::Error if not).
    // `batched`: score_batch() positions a decode, logits at each (fast); otherwise one token per decode, as
    // generation runs and as `bench quality` measures a lossy knob (what it does depends on the batch).
    // What is wrong with the text (too short, longer than the context, an id outside the vocabulary) is a
    // RequestError.
    std::vector<PositionLogprobs> score_positions(const std::vector<int32_t> & tokens, int n_top, int32_t first,
                                                  int32_t count, bool batched);
    // The positions one batched decode of score_positions scores: the context's batch, at most as many as keep
    // the logits llama.cpp holds for them within 16 MiB.
    int32_t score_batch() const;
    int32_t vocab_size() const;

    // The model's chat template (tokenizer.chat_template), empty when the file has none.
    std::string chat_template() const;
    // The tokens whose keys and values the context holds, in order.
    const std::vector<int32_t> & context_tokens() const;
    // Forget the context (the next begin decodes its whole prompt).
    void reset();
    // Between generations (a server waiting for a request): fault in up to `max_bytes` of the memory the
    // expert cache's budget allows, so the next prompt does not wait for the kernel to zero it. Returns the
    // bytes still to fault in (0: done, or nothing is streamed). Meant for the gaps between generations; inside
    // one it first waits for the reads in flight, like the next step would.
    uint64_t warm_cache_memory(uint64_t max_bytes);
    // llama.cpp's state file: the context's KV cache and its tokens, so a restart can resume a
    // conversation. Loading checks that the file belongs to this model and fits this context.
    void save_state(const std::string & path) const;
    void load_state(const std::string & path);
    // Several generations at once (config.parallel slots, 0 .. n_slots()-1), each its own sequence of the
    // context with its own sampler (seed, grammar, penalties), advanced together by step_slots. The slots
    // and begin/next/score/state files share the context: use one or the other (reset() forgets both).
    int32_t n_slots() const;
    // Start a generation in `slot`; with `reuse_kv` the slot's longest common prefix with `prompt` stays
    // (returns its length). Checks as begin() does, before the slot is touched.
    int32_t slot_begin(int32_t slot, const std::vector<int32_t> & prompt, const SamplingParams & sampling,
                       bool want_logits, bool reuse_kv);
    // Stop the slot's generation; its keys and values stay for a returning conversation (slot_tokens).
    void slot_stop(int32_t slot);
    // ... and forget them too (another tenant's request comes next).
    void slot_clear(int32_t slot);
    const std::vector<int32_t> & slot_tokens(int32_t slot) const;
    bool slot_active(int32_t slot) const;
    // One decode of every active slot: a token for each slot past its prompt, a prompt chunk for the others.
    // Empty when no slot is active. A failed decode ends every slot's generation (their contexts cleared)
    // and throws bmoe::Error.
    BatchStep step_slots();

    // Free everything now (model, context, lanes, mirrors; waits for a read stuck in the kernel).
    // Every later call throws bmoe::Error "the engine is closed". Idempotent.
    void close();

private:
    friend class ChatTemplates;  // chat.cpp: common's templates read the model's own (and its BOS/EOS)
    const detail::Model & model() const;
    struct Impl;
    Impl & live() const;  // throws when closed
    std::unique_ptr<Impl> impl_;
};

}  // namespace bmoe
