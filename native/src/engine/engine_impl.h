// The engine's state, shared by its two halves: engine.cpp opens a model and makes it stream
// (load, capture, mirror, cache size); generation.cpp runs it (prompts, decoding, speculation, the
// context and its state files). Internal: llama.cpp types are fine here, never in bmoe/engine.h.
#pragma once

#include <algorithm>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bmoe/engine.h"
#include "bmoe/error.h"
#include "model/gguf_map.h"
#include "llama-cpp.h"  // llama.h, and its owning pointers
#include "policy/memory_budget.h"
#include "draft/mtp_draft.h"
#include "policy/ngram_draft.h"
#include "policy/prefetch_policy.h"
#include "seam/route_trace.h"
#include "rpc/rpc_workers.h"
#include "seam/seam.h"
#include "engine/sequences.h"
#include "engine/stream_setup.h"

namespace bmoe {

namespace detail {
using Clock = std::chrono::steady_clock;

inline double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

using SamplerDeleter = SamplerChainDeleter;

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

// The log-probabilities at one position from its raw logits (scoring.cpp): `chosen` and the `n_top` most likely.
PositionLogprobs position_logprobs(const float * logits, const llama_vocab * vocab, llama_token chosen, int n_top);

}  // namespace detail

struct Engine::Impl {
    StreamConfig config;
    // What the settings resolve to at open (the engine works with these, not with their texts or auto).
    bool overlap = false;
    FaultInjection fault;
    std::vector<std::string> rpc_endpoints;
    std::vector<double> rpc_split;
    RunInfo info;
    std::unique_ptr<detail::GgufMap> gguf;
    std::unique_ptr<detail::RpcWorkers> rpc;  // registered before the model loads
    detail::LayerPlacement placement;
    std::unique_ptr<detail::Seam> seam;
    detail::StreamingParts streaming;  // after the seam, before the model: outlives both uses
    llama_model_ptr model;
    llama_context_ptr ctx;
    std::unique_ptr<detail::MtpDraft> mtp;  // the model's own draft head (--speculative mtp), over `ctx`
    uint64_t budget_with_drafter = 0;   // the cache's budget when the drafter last went to sleep
    std::unique_ptr<llama_sampler, detail::SamplerDeleter> sampler;
    const llama_vocab * vocab = nullptr;
    std::unique_ptr<detail::MemoryBudget> memory;
    std::unique_ptr<detail::RouteTrace> route_trace;
    std::unique_ptr<detail::PrefetchPolicy> prefetch;
    std::unique_ptr<detail::ExpertReadyHook> hook;  // last member: unregistered before anything is freed
    std::vector<llama_token> pending;
    std::vector<llama_token> in_context;  // what the KV cache holds, position by position
    std::deque<llama_token> accepted;       // verified by a speculative step, not yet handed out
    struct Verified {  // what a verified token hands out besides itself
        std::string logits;
        PositionLogprobs logprobs;
    };
    std::deque<Verified> accepted_outputs;
    std::vector<detail::Slot> slots;  // --parallel's sequences (sequences.cpp); empty until the first slot_begin
    int slot_steps = 0;               // step_slots' calls so far: the route trace's step numbers of a batch
    bool want_logits = false;
    int n_logprobs = -1;                    // sampling.logprobs of this generation (-1: none)
    bool greedy = true;                     // speculation only where it cannot change the tokens
    // Why the last decode failed: the generation is over, next() refuses until begin() (which
    // clears the KV cache) starts a new one. Empty while healthy.
    std::string failure;
    int step = 0;
    // Compute threads of a decode and of a prompt's batch (create_context): a prompt of at least
    // kPromptAllCoresTokens is compute-bound, and its reads hide behind its compute (generation.cpp).
    int decode_threads = 1;
    int prompt_threads = 1;
    static constexpr int kPromptAllCoresTokens = 64;
    // The physical batch a prompt is decoded in: the context's ubatch, or less where the memory limit cannot
    // hold its compute buffers beside the model even with the cache emptied (size_cache, docs/memory.md).
    int prompt_ubatch = 1;

    Speculative speculation = Speculative::Off;  // what --speculative resolved to at open (never Auto)
    detail::DraftPolicy draft_policy;
    // (its constants, n-gram lengths and the MTP head's give-up and pauses: DraftPolicy's, policy/ngram_draft.h)

    void open(const std::string & path);
    // open's steps, in the order it takes them (engine.cpp)
    void record_settings(const std::string & path);
    void open_route_trace();
    void read_file_header(const std::string & path);
    void check_lossy_settings(const std::string & path);
    void refuse_unstreamable(const std::string & path, const Recipe & recipe_row);
    void place_layers_on_workers();
    void load_model(const std::string & path, const Recipe * recipe);
    void read_model_shape(const std::string & path);
    llama_context_params context_params() const;
    void create_context();
    void set_up_speculation();  // speculation.cpp
    void capture_weights(const Recipe & recipe);
    void warm_up_and_capture();
    void stream_only_local_layers();
    void size_cache();
    void route_to_streamer();
    void set_up_read_ahead();
    void decode(std::vector<llama_token> & tokens, bool all_logits = false);
    // The most tokens one llama_decode of `decode` takes: the context's batch, or the ubatch a prompt affords where
    // that is less than the context's (size_cache).
    int32_t batch_per_call() const {
        return prompt_ubatch < config.ubatch ? std::min(config.batch, prompt_ubatch) : config.batch;
    }
    // Around a batch with prompt tokens (a prompt, a --parallel step with a chunk): its compute buffers are
    // made room for first and go back to the cache after it (docs/memory.md). After: the bytes given back.
    void make_room_for_prompt(int n_tokens, int n_sequences = 1);
    uint64_t give_prompt_memory_back();
    // One llama_decode-like call of `n` tokens from `first_pos` on either context, the engine's way:
    // the route trace told, overlap's reads drained, the seam's error thrown first.
    void run_decode(int first_pos, int n, const std::function<int()> & run);
    detail::MtpDraft::Decode draft_decoder();
    // Whether the MTP head's layers (every chained block) keep a share of the expert cache.
    void cache_heads(bool on);
    // A new generation (greedy: drafting again, a sleeping draft model woken) (speculation.cpp).
    void resume_drafting();
    void learn_from_drafts(int drafted, int accepted);
    // What a drafter holds (a head's cache share, a draft model's pages) only while it drafts; after
    // each verify or probe and before each draft.
    void hold_drafter();
    void sleep_drafter();
    void wake_drafter();
    std::vector<llama_token> draft_for(llama_pos used);
    void check_probe(llama_token drafted, llama_token chosen, StepResult & out);
    llama_token verify(std::vector<llama_token> & batch, size_t n_draft, StepResult & out);
    void emit(StepResult & out, llama_token token);
    // What a step hands out besides its token, from the logits at batch index `index` (the sampler's).
    void record_outputs(std::string & logits, PositionLogprobs & logprobs, int32_t index, llama_token token) const;
    std::unique_ptr<llama_sampler, detail::SamplerDeleter> build_sampler(
        const SamplingParams & sampling, std::unique_ptr<llama_sampler, detail::SamplerDeleter> grammar,
        const std::vector<llama_token> & prompt) const;
    // A generation's sampler chain, its settings, bias and grammar checked first (begin, slot_begin).
    std::unique_ptr<llama_sampler, detail::SamplerDeleter> sampler_for(const SamplingParams & sampling,
                                                                        const std::vector<llama_token> & prompt) const;
    void forget_slots();  // the context was cleared under them (sequences.cpp)
    bool step_once(StepResult & out);
};

}  // namespace bmoe
