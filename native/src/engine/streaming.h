// Streaming as one component: the seam on llama.cpp's eval callback, the streaming parts (mirrors, pool,
// lanes, streamer), the cache's memory budget, the read-ahead policy, the route trace and the expert-ready
// hook. Built in the open's order (the seam before the context, the parts after the warm-up capture), then
// asked around each step: counters from zero before it, room for a prompt's compute buffers, the budget
// adapted after it. Without streaming (--no-stream) only the route trace's refusal is left of it.
#pragma once

#include <memory>

#include "bmoe/config.h"
#include "bmoe/metrics.h"
#include "bmoe/recipes.h"
#include "draft/mtp_draft.h"
#include "engine/model.h"
#include "engine/stream_setup.h"
#include "llama.h"
#include "policy/memory_budget.h"
#include "policy/prefetch_policy.h"
#include "seam/route_trace.h"
#include "seam/seam.h"

namespace bmoe::detail {

class Streaming {
public:
    // With the fault to inject: whether reads overlap compute, the route trace's file (a bad path fails now).
    Streaming(const StreamConfig & config, const FaultInjection & fault);
    Streaming(const Streaming &) = delete;
    Streaming & operator=(const Streaming &) = delete;

    // The open's steps, in order (engine.cpp): the seam (before the context: its callback), then after the
    // context and the drafter the capture, the parts, the cache's size and the callbacks.
    void make_seam(const Recipe & recipe);
    void capture_weights(const Recipe & recipe, const ModelSource & file, llama_context * ctx, MtpDraft * mtp,
                         const llama_vocab * vocab);
    void attach(const ModelSource & file, RunInfo & info);
    void stream_only_local_layers(const ModelSource & file, const RunInfo & info);
    // Returns the ubatch a prompt is decoded in (less than asked where the memory limit cannot hold more).
    int size_cache(const ModelSource & file, MtpDraft * mtp, RunInfo & info);
    // --repack all, or auto where the budget just sized holds every expert: the streamed experts compute on
    // llama.cpp's repacked kernels (each slice converted as it is read); else the dense weights alone do.
    void choose_expert_kernels(RunInfo & info);
    // The cache, once sized, holds every streamed expert: once they are in, decodes read nothing.
    bool holds_every_expert(const RunInfo & info) const {
        return parts_.streamer && parts_.streamer->cache().budget() >= info.expert_bytes;
    }
    void route_to_streamer(llama_context * ctx, MtpDraft * mtp);
    void set_up_read_ahead(RunInfo & info);
    void start();  // the seam streams from now on

    bool on() const { return parts_.streamer != nullptr; }
    Streamer * streamer() const { return parts_.streamer.get(); }
    Seam * seam() const { return seam_.get(); }
    MemoryBudget * memory() const { return memory_.get(); }
    RouteTrace * route_trace() const { return route_trace_.get(); }
    bool overlap() const { return overlap_; }
    const FaultInjection & fault() const { return fault_; }

    // One step: the streamer's counters from zero and the read-ahead decision (before); its counters, the
    // budget adapted (not after a prompt: it was rebased just now) and the pool trimmed (after).
    void begin_step(TokenMetrics & m);
    void end_step(TokenMetrics & m, bool prompt, uint64_t faults0);
    // Around each llama_decode (Context::run_decode): whether its graph runs whole, in one piece: every streamed
    // expert resident (Streamer::holds_every_expert), the hook there to note the experts used, and nothing that
    // must see the routing as it happens (the route trace, --drop-cold). end_graph counts what it used.
    bool begin_graph();
    void end_graph(bool whole);
    // Around a batch with prompt tokens: its compute buffers are made room for first and go back to the cache
    // after it (docs/memory.md). give_prompt_memory_back returns the bytes given back.
    void make_room_for_prompt(int n_tokens, int n_sequences, int prompt_ubatch);
    uint64_t give_prompt_memory_back();
    // Between generations: fault in up to `max_bytes` of the cache's memory (Engine::warm_cache_memory).
    uint64_t warm(uint64_t max_bytes, uint64_t expert_bytes);

private:
    void warm_up_and_capture(llama_context * ctx, MtpDraft * mtp, const llama_vocab * vocab);

    const StreamConfig & config_;
    FaultInjection fault_;
    bool overlap_ = false;
    int whole_graphs_ = 0;  // since the step began
    std::unique_ptr<RouteTrace> route_trace_;
    std::unique_ptr<Seam> seam_;
    StreamingParts parts_;  // after the seam: the seam's callbacks point into it
    std::unique_ptr<MemoryBudget> memory_;
    std::unique_ptr<PrefetchPolicy> prefetch_;
    std::unique_ptr<ExpertReadyHook> hook_;  // last: unregistered before the streamer is freed
};

}  // namespace bmoe::detail
