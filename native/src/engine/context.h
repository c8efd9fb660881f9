// The llama_context and what runs on it: its parameters, one decode the engine's way (the route trace told,
// overlap's reads drained, the seam's error first), a batch cut into the calls it affords, the compute threads
// of a prompt, the state files, and teacher-forced scoring (scoring.cpp).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bmoe/config.h"
#include "bmoe/engine.h"
#include "engine/model.h"
#include "engine/streaming.h"
#include "ggml-cpu.h"
#include "llama-cpp.h"
#include "model/llama_runtime.h"

namespace bmoe::detail {

// One token of a batch: its position in its sequence, and whether the batch returns its logits.
struct BatchEntry {
    llama_token token;
    llama_pos pos;
    llama_seq_id seq;
    bool logits;
};

class Context {
public:
    Context(const StreamConfig & config, const ModelSource & file, const Model & model, Streaming & streaming,
            RunInfo & info);
    Context(const Context &) = delete;
    Context & operator=(const Context &) = delete;

    llama_context * get() const { return ctx_.get(); }
    // The target context's parameters (a drafter's context is made with the same).
    llama_context_params params() const;
    // A prompt of at least this many tokens is compute-bound, and its reads hide behind its compute.
    static constexpr int kPromptAllCoresTokens = 64;
    // Around a batch with `prompt_tokens` of prompts: every core for a long one (the constructor says why).
    BatchThreads threads_for(size_t prompt_tokens) const;
    // Compute threads that spin between graphs as llama.cpp's own do: once the cache holds every expert.
    void spin_compute_threads();
    // The physical batch a prompt is decoded in (Streaming::size_cache): the ubatch, or what memory affords.
    void set_prompt_ubatch(int n) { prompt_ubatch_ = n; }
    int prompt_ubatch() const { return prompt_ubatch_; }
    // The most tokens one llama_decode of `decode` takes: the context's batch, or the ubatch a prompt affords
    // where that is less than the context's.
    int32_t batch_per_call() const {
        return prompt_ubatch_ < config_.ubatch ? std::min(config_.batch, prompt_ubatch_) : config_.batch;
    }

    // One llama_decode-like call of `n` tokens from `first_pos` on this or a drafter's context.
    void run_decode(int first_pos, int n, const std::function<int()> & run);
    // `entries` in calls of at most batch_per_call tokens; after each, `after_call(first entry, count)`.
    // Logits are those of the last call only: a caller samples only there.
    void decode(const std::vector<BatchEntry> & entries, const std::function<void(size_t, int)> & after_call);
    void clear();                                // every sequence's keys and values
    bool cut(llama_seq_id seq, llama_pos from);  // false where a recurrent state cannot be cut there
    const float * logits(int32_t row) const { return llama_get_logits_ith(ctx_.get(), row); }
    std::string logits_bytes(int32_t row, const llama_vocab * vocab) const;

    void save_state(const std::string & path, const std::vector<llama_token> & tokens) const;
    std::vector<llama_token> load_state(const std::string & path);  // the tokens; throws (cleared) on failure

    // Teacher-forced (scoring.cpp): positions first .. first+count-1 of `tokens`, with sequence 0's tokens
    // in `in_context` (first == 0: `start_afresh` once the request is checked; else it must hold tokens[:first]).
    std::vector<PositionLogprobs> score(const std::vector<int32_t> & tokens, int n_top, int32_t first, int32_t count,
                                        bool batched, std::vector<llama_token> & in_context,
                                        const std::function<void()> & start_afresh);
    int32_t score_batch() const;

private:
    struct FreePool {
        void operator()(ggml_threadpool * pool) const { ggml_threadpool_free(pool); }
    };
    using Pool = std::unique_ptr<ggml_threadpool, FreePool>;
    void attach_pools();
    Pool make_pool(int threads, bool spin);  // spin: ggml's default poll; else its workers sleep between graphs

    const StreamConfig & config_;
    const ModelSource & file_;
    const Model & model_;
    Streaming & streaming_;
    Pool decode_pool_;  // before ctx_: the context computes on them until it is freed
    // The pools spin_compute_threads replaced: ggml's CPU backend pauses the pool it last computed on when it is
    // handed another, so those must live as long as the context too.
    Pool replaced_pools_[2];
    Pool prompt_pool_;
    llama_context_ptr ctx_;
    int decode_threads_ = 1;
    int prompt_threads_ = 1;
    int prompt_ubatch_ = 1;
};

}  // namespace bmoe::detail
