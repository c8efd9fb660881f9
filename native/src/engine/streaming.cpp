// Streaming's open steps and its part of each step (streaming.h): the warm-up that captures every weight, the
// layers streamed here (RPC workers aside), the router's experts to the streamer, read-ahead, the cache sized
// from the memory really there; then each step's counters, a prompt's room and the budget adapted.
#include "engine/streaming.h"

#include <algorithm>
#include <functional>
#include <memory>

#include "bmoe/build_info.h"
#include "bmoe/engine.h"
#include "bmoe/error.h"
#include "core/telemetry.h"
#include "model/expert_names.h"
#include "policy/cache_sizing.h"
#include "seam/seam_drop.h"

namespace bmoe::detail {

Streaming::Streaming(const StreamConfig & config, const FaultInjection & fault) : config_(config), fault_(fault) {
    // auto: on where this build has the hook and no other engine of this process holds it (process-wide)
    overlap_ = config.overlap == Toggle::On ||
               (config.overlap == Toggle::Auto && build_info().expert_ready_hook && !overlap_in_use());
    if (!config.route_trace.empty()) {
        if (!config.stream) {
            throw Error("the route trace needs streaming: the routed experts are read where the engine streams them");
        }
        route_trace_ = std::make_unique<RouteTrace>(config.route_trace);  // a bad path fails now
    }
}

void Streaming::make_seam(const Recipe & recipe) { seam_ = std::make_unique<Seam>(recipe); }

void Streaming::attach(const ModelSource & file, RunInfo & info) {
    parts_ = attach_streaming(file.gguf(), *seam_, config_, fault_, info);
}

void Streaming::start() { seam_->set_mode(Seam::Mode::Stream); }
// The warm-up decode with the seam capturing, the routed experts hinted to the kernel first.
void Streaming::capture_weights(const Recipe & recipe, const ModelSource & file, llama_context * ctx, MtpDraft * mtp,
                                const llama_vocab * vocab) {
    if (!file.rpc()) {  // a worker's experts are read there
        seam_->set_warm_up_hint(warm_up_reads(file.gguf(), recipe));
    }
    warm_up_and_capture(ctx, mtp, vocab);
    seam_->set_warm_up_hint(nullptr);
}

// With RPC workers: isolate only the routers of the layers computed here.
void Streaming::stream_only_local_layers(const ModelSource & file, const RunInfo & info) {
    if (!file.rpc()) {
        return;
    }
    for (const auto & c : seam_->captured()) {  // a worker's layer computed here would read unrouted bytes
        if (c.is_expert && c.host && c.layer >= file.placement().main_layers) {
            throw Error("expert tensor " + c.name + " belongs to a layer placed on an RPC worker but sits in this "
                        "process's memory: llama.cpp did not place it as asked");
        }
    }
    std::vector<bool> local(static_cast<size_t>(info.n_layer), false);
    for (int il = 0; il < file.placement().main_layers && il < info.n_layer; ++il) {
        local[static_cast<size_t>(il)] = true;
    }
    seam_->set_streamed_layers(std::move(local));
}

// The seam's router hands each layer's routed experts to the streamer (published for the hook with
// overlap, else read before the callback returns), through the route trace and the cold dropper.
void Streaming::route_to_streamer(llama_context * ctx, MtpDraft * mtp) {
    Streamer & streamer = *parts_.streamer;
    if (overlap_) {
        hook_ = std::make_unique<ExpertReadyHook>(streamer);
        const ggml_abort_callback failed = [](void * s) { return static_cast<Streamer *>(s)->failed(); };
        llama_set_abort_callback(ctx, failed, &streamer);
        if (mtp) {  // the MTP head's graph too
            mtp->set_abort_callback(failed, &streamer);
        }
    }
    RouteTrace * trace = route_trace_.get();
    const bool overlapped = overlap_;
    seam_->set_router([&streamer, trace, overlapped](int layer, const std::vector<int> & e, int per_token) {
        if (trace != nullptr) {
            trace->record(layer, e, per_token);
        }
        if (overlapped) {
            streamer.publish(layer, e);
        } else {
            streamer.make_resident(layer, e);
        }
    });
    if (config_.drop_cold > 0) {
        seam_->set_cold_dropper(std::make_unique<ColdDropper>(
            config_.drop_cold, [&streamer](int layer, int e) { return streamer.resident(layer, e); },
            [&streamer](int layer) { return streamer.cached_experts(layer); }));
    }
}

// --prefetch: the seam's guesses go to the streamer, and the policy says when to read ahead.
void Streaming::set_up_read_ahead(RunInfo & info) {
    Streamer & streamer = *parts_.streamer;
    RouteTrace * trace = route_trace_.get();
    if (config_.prefetch != Prefetch::Off) {
        seam_->set_predicted_layers(info.n_layer);  // never the trunk's last layer to an MTP head's
        seam_->set_read_ahead([&streamer, trace](int layer, const std::vector<int> & e, bool read) {
            if (!read) {
                streamer.count_guess(layer, e);  // the trace's guesses are those read ahead
                return;
            }
            if (trace != nullptr) {
                trace->predicted(layer, e);
            }
            streamer.prefetch(layer, e);
        });
        prefetch_ = std::make_unique<PrefetchPolicy>(
            config_.prefetch == Prefetch::Auto ? PrefetchPolicy::Mode::Auto : PrefetchPolicy::Mode::Predict);
        info.prefetch = to_string(config_.prefetch);
        if (!seam_->can_read_ahead()) {
            info.prefetch_note = "no two consecutive layers with router weights (blk.N.ffn_gate_inp.weight): nothing to predict from";
        }
    }
}

// One decode with the seam observing: every weight the graph uses is recorded, experts by name.
// The experts it routes to are read through llama.cpp's mapping this once.
void Streaming::warm_up_and_capture(llama_context * ctx, MtpDraft * mtp, const llama_vocab * vocab) {
    seam_->set_mode(Seam::Mode::Capture);
    llama_token token = llama_vocab_bos(vocab);
    if (token == LLAMA_TOKEN_NULL) {
        token = 0;
    }
    int rc = llama_decode(ctx, llama_batch_get_one(&token, 1));
    if (rc == 0 && mtp) {  // the head's own layer (its experts) runs only in the draft context
        mtp->warm_up(token, [&rc](llama_pos, int, const std::function<int()> & run) { rc = run(); });
    }
    seam_->set_mode(Seam::Mode::Off);
    llama_memory_clear(llama_get_memory(ctx), true);
    if (rc != 0) {
        throw Error("the warm-up decode failed (llama_decode returned " + std::to_string(rc) + ")");
    }
}

// A slice read and used once costs a lane more to convert than the repacked kernel saves computing it (under a
// 40% cap, converting every read took the 3 GB preset from 8.5 to 5.3 tok/s: bench-data/2026-12-05/repack); a
// cached one is converted once and computed on at every token that routes to it. auto repacks the experts only
// where the cache can keep every one of them.
void Streaming::choose_expert_kernels(RunInfo & info) {
    const bool all = config_.repack == Repack::All || (config_.repack == Repack::Auto && holds_every_expert(info));
    if (all && parts_.repacked) {
        repack_experts(parts_, info);
        info.repack = to_string(Repack::All);
    } else {
        info.repack = to_string(config_.repack == Repack::Off ? Repack::Off : Repack::Dense);
    }
}

// The cache budget from the memory really there, now that the dense weights are loaded and the
// KV cache and compute buffers are allocated (detail/memory_budget.h says how).
int Streaming::size_cache(const ModelSource & file, MtpDraft * mtp, RunInfo & info) {
    Streamer & streamer = *parts_.streamer;
    // Loading left the file's pages in the page cache; the experts come by O_DIRECT (or into the
    // mirror) and the dense weights are mapped, so those pages only crowd a memory limit. Under one,
    // every page the cache's pool took later would first make the kernel reclaim one of them, and
    // pages freed one by one come back scattered: a slice's read then has ~50 physical segments
    // instead of ~8, and on a virtualized disk each segment costs (docs/memory.md).
    for (const auto & slices : parts_.files) {
        slices->drop_unmapped_page_cache();
    }
    Footprint footprint;
    for (const RuntimeBuffer & b : seam_->runtime_buffers()) {
        (b.scratch ? footprint.scratch : footprint.to_touch).push_back({b.data, b.size});
    }
    if (config_.dense == DenseMode::Mmap) {  // with dense=anon they were read into the mirror already
        std::vector<DrafterPages> head_pages;
        for (const auto & c : seam_->captured()) {
            if (c.is_expert || !c.host) {  // a worker's weights are not this process's memory
                continue;
            }
            // An MTP head's (its layers follow the trunk's): they sleep with it (Drafter::hold).
            // A repacked one is not the file's bytes: it cannot sleep and be read back, it stays.
            const bool head = mtp && !mtp->separate_model() && block_of(c.name) >= info.n_layer && !c.repacked;
            (head ? footprint.drafter : footprint.to_touch).push_back({Seam::data(c), c.nbytes});
            const TensorLocation * loc = head ? file.gguf().find(c.name) : nullptr;
            if (loc != nullptr) {
                head_pages.push_back({file.gguf().files()[loc->file], Seam::data(c), c.nbytes, loc->offset});
            }
        }
        if (mtp && !mtp->separate_model()) {
            mtp->set_own_pages(std::move(head_pages));
        }
    }
    uint64_t widest_layer = 0;
    for (int l = 0; l < streamer.n_layers(); ++l) {
        widest_layer = std::max(widest_layer, streamer.bytes_per_expert(l));
    }
    footprint.expert_bytes_widest = widest_layer;
    footprint.n_expert = info.n_expert;
    footprint.n_expert_used = info.n_expert_used;
    const auto projections = static_cast<uint64_t>(info.streamed_tensors / std::max(1, streamer.n_layers()));
    CacheShape shape;
    shape.n_expert = static_cast<uint64_t>(info.n_expert);
    shape.n_expert_used = static_cast<uint64_t>(info.n_expert_used);
    shape.parallel = config_.parallel;
    shape.prefetch = config_.prefetch != Prefetch::Off;
    shape.widest_expert_bytes = widest_layer;
    shape.projections = projections;
    shape.page_size = info.page_size;
    footprint.in_flight_bytes = in_flight_bytes(shape);
    footprint.mappings_cap_bytes = mappings_cap_bytes(mappings_left(), projections, streamer.n_layers(),
                                                              streamer.cache().bytes_per_token_slot(), info.expert_bytes);
    memory_ = std::make_unique<MemoryBudget>(config_, std::move(footprint), streamer.cache().bytes_per_token_slot());
    // A prompt's compute buffers are written only while it is decoded, and the cache makes room for them then
    // (before_prompt): the ubatch is what that room affords, so a context sized for a long prompt in one ubatch
    // cannot take a small board over its limit (a fixed or no cache has nothing to give: its ubatch is as
    // asked, and a limit too small for it is an error below). A smaller one is said: a resident reference
    // must use it too (llama.cpp's float results may depend on the ubatch split).
    int prompt_ubatch = config_.ubatch;
    if (config_.cache_mb == kAuto) {
        prompt_ubatch = memory_->fit_prompt_ubatch(config_.ubatch, streamer.pool_held_bytes());
    }
    BudgetReport report = memory_->initial(read_memory());
    if (prompt_ubatch < config_.ubatch) {
        info.ubatch = prompt_ubatch;
        report.note += std::string(report.note.empty() ? "" : "; ") + "prompts are decoded in ubatches of " +
                       std::to_string(prompt_ubatch) + " tokens, not " + std::to_string(config_.ubatch) +
                       ": the memory limit cannot hold the compute buffers of more";
    }
    info.cache_mode = config_.cache_mb == 0 ? "off" : config_.cache_mb == kAuto ? "auto" : "fixed";
    info.cache_budget_mb = static_cast<double>(report.budget) / 1048576.0;
    info.cache_note = report.note;
    info.memory_limit_source = report.limit_source;
    info.memory_limit_mb = static_cast<double>(report.limit) / 1048576.0;
    info.memory_headroom_mb = static_cast<double>(report.headroom) / 1048576.0;
    info.memory_pending_mb = static_cast<double>(report.pending) / 1048576.0;
    info.cache_adaptive = memory_->adaptive();
    if (!report.note.empty()) {
        info.warning += std::string(info.warning.empty() ? "" : "; ") + report.note;
    }
    parts_.pool->set_huge_pages(pool_wants_huge_pages(report.budget, info.expert_bytes));
    streamer.set_budget(report.budget);
    return prompt_ubatch;
}


void Streaming::begin_step(TokenMetrics & m) {
    if (parts_.streamer) {
        parts_.streamer->take_counters();  // start this step's counters from zero
    }
    whole_graphs_ = 0;
    if (prefetch_) {
        m.read_ahead = prefetch_->reads_ahead();
        seam_->set_ahead(m.read_ahead                 ? Seam::Ahead::Read
                         : prefetch_->guesses_only() ? Seam::Ahead::Count
                                                     : Seam::Ahead::None);
    }
}

void Streaming::end_step(TokenMetrics & m, bool prompt, uint64_t faults0) {
    if (!parts_.streamer) {
        return;
    }
    Streamer & streamer = *parts_.streamer;
    const StreamCounters c = streamer.take_counters();
    m.io_ms = c.io_ms;
    m.stall_ms = c.stall_ms;
    m.drain_ms = c.drain_ms;
    m.bytes_read = c.storage_bytes;
    m.slice_bytes = c.slice_bytes;
    m.copy_bytes = c.copy_bytes;
    m.convert_ms = c.convert_ms;
    m.whole_graphs = whole_graphs_;
    m.cache_lookups = c.lookups;
    m.cache_hits = c.hits;
    m.evictions = c.evictions;
    m.rereads = c.rereads;
    m.dropped = seam_->take_dropped();
    m.predicted = c.predicted;
    m.predicted_correct = c.predicted_correct;
    m.ahead_bytes = c.ahead_bytes;
    m.ahead_wasted_bytes = c.ahead_wasted_bytes;
    m.guessed_bytes = c.guessed_bytes;
    m.guessed_wasted_bytes = c.guessed_wasted_bytes;
    if (prefetch_ && m.n_tokens == 1) {
        prefetch_->record(
            {m.wall_ms, m.io_ms, m.stall_ms, m.bytes_read, m.guessed_bytes, m.guessed_wasted_bytes, m.read_ahead});
    }
    m.routed_bytes = c.routed_bytes;
    m.resident_expert_bytes = streamer.resident_expert_bytes();
    const uint64_t budget = streamer.cache().budget();
    // A prompt's step was rebased just now, and its major faults are the dense weights' first reads.
    const uint64_t adapted =
        prompt || !memory_ ? budget : memory_->adapt(budget, streamer.pool_held_bytes(), major_faults() - faults0);
    if (adapted != budget) {
        streamer.set_budget(adapted);
    } else if (!prompt) {
        streamer.trim_spare();
    }
    m.cache_budget_bytes = adapted;
    m.pool_bytes = streamer.pool_held_bytes();
}

bool Streaming::begin_graph() {
    Streamer * streamer = parts_.streamer.get();
    if (!hook_ || !streamer || route_trace_ || config_.drop_cold > 0 || !streamer->holds_every_expert()) {
        return false;
    }
    ++whole_graphs_;
    seam_->set_whole_graph(true);
    streamer->begin_whole_graph();
    return true;
}

void Streaming::end_graph(bool whole) {
    if (whole) {
        seam_->set_whole_graph(false);
        parts_.streamer->end_whole_graph();
    }
}

void Streaming::make_room_for_prompt(int n_tokens, int n_sequences, int prompt_ubatch) {
    Streamer & streamer = *parts_.streamer;
    streamer.count_uses_per_sequence(n_sequences);
    const uint64_t budget = streamer.cache().budget();
    // A prompt decoded in ubatches of prompt_ubatch writes that share of the compute buffers (made for ubatch).
    const uint64_t room = memory_->before_prompt(budget, streamer.pool_held_bytes(), std::min(n_tokens, prompt_ubatch),
                                                 config_.ubatch);
    if (room != budget) {
        streamer.set_budget(room);
    }
    seam_->begin_decode();
}

uint64_t Streaming::give_prompt_memory_back() {
    Streamer & streamer = *parts_.streamer;
    std::vector<Region> scratch;
    for (const RuntimeBuffer & b : seam_->last_scratch()) {
        scratch.push_back({b.data, b.size});
    }
    streamer.count_uses_per_sequence(0);
    const uint64_t budget = streamer.cache().budget();
    streamer.settle();  // the layers the prompt left over their share, and the pool's spare pages
    const uint64_t after = memory_->after_prompt(budget, streamer.pool_held_bytes(), scratch);
    if (after != budget) {
        streamer.set_budget(after);
    }
    return memory_->released_bytes();
}

uint64_t Streaming::warm(uint64_t max_bytes, uint64_t expert_bytes) {
    if (!parts_.streamer) {
        return 0;
    }
    parts_.streamer->drain();  // a read-ahead batch of the last decode must land before the pool moves
    return parts_.streamer->warm_pool(max_bytes, expert_bytes);
}

}  // namespace bmoe::detail
