// Engine::open's streaming steps (engine_impl.h): the warm-up that captures every weight, the layers streamed
// here (RPC workers aside), the router's experts to the streamer, read-ahead, and the cache sized from the
// memory really there. Split from engine.cpp, which opens the file, the model and the context.
#include <algorithm>
#include <functional>
#include <memory>

#include "bmoe/error.h"
#include "engine/engine_impl.h"
#include "policy/cache_sizing.h"
#include "model/expert_names.h"
#include "seam/seam_drop.h"
#include "core/telemetry.h"

namespace bmoe {

// The warm-up decode with the seam capturing, the routed experts hinted to the kernel first.
void Engine::Impl::capture_weights(const Recipe & recipe) {
    if (!rpc) {  // a worker's experts are read there
        seam->set_warm_up_hint(detail::warm_up_reads(*gguf, recipe));
    }
    warm_up_and_capture();
    seam->set_warm_up_hint(nullptr);
}

// With RPC workers: isolate only the routers of the layers computed here.
void Engine::Impl::stream_only_local_layers() {
    if (!rpc) {
        return;
    }
    for (const auto & c : seam->captured()) {  // a worker's layer computed here would read unrouted bytes
        if (c.is_expert && c.host && c.layer >= placement.main_layers) {
            throw Error("expert tensor " + c.name + " belongs to a layer placed on an RPC worker but sits in this "
                        "process's memory: llama.cpp did not place it as asked");
        }
    }
    std::vector<bool> local(static_cast<size_t>(info.n_layer), false);
    for (int il = 0; il < placement.main_layers && il < info.n_layer; ++il) {
        local[static_cast<size_t>(il)] = true;
    }
    seam->set_streamed_layers(std::move(local));
}

// The seam's router hands each layer's routed experts to the streamer (published for the hook with
// overlap, else read before the callback returns), through the route trace and the cold dropper.
void Engine::Impl::route_to_streamer() {
    detail::Streamer & streamer = *streaming.streamer;
    if (overlap) {
        hook = std::make_unique<detail::ExpertReadyHook>(streamer);
        const ggml_abort_callback failed = [](void * s) { return static_cast<detail::Streamer *>(s)->failed(); };
        llama_set_abort_callback(ctx.get(), failed, &streamer);
        if (mtp) {  // the MTP head's graph too
            mtp->set_abort_callback(failed, &streamer);
        }
    }
    detail::RouteTrace * trace = route_trace.get();
    const bool overlapped = overlap;
    seam->set_router([&streamer, trace, overlapped](int layer, const std::vector<int> & e, int per_token) {
        if (trace != nullptr) {
            trace->record(layer, e, per_token);
        }
        if (overlapped) {
            streamer.publish(layer, e);
        } else {
            streamer.make_resident(layer, e);
        }
    });
    if (config.drop_cold > 0) {
        seam->set_cold_dropper(std::make_unique<detail::ColdDropper>(
            config.drop_cold, [&streamer](int layer, int e) { return streamer.resident(layer, e); },
            [&streamer](int layer) { return streamer.cached_experts(layer); }));
    }
}

// --prefetch: the seam's guesses go to the streamer, and the policy says when to read ahead.
void Engine::Impl::set_up_read_ahead() {
    detail::Streamer & streamer = *streaming.streamer;
    detail::RouteTrace * trace = route_trace.get();
    if (config.prefetch != Prefetch::Off) {
        seam->set_predicted_layers(info.n_layer);  // never the trunk's last layer to an MTP head's
        seam->set_read_ahead([&streamer, trace](int layer, const std::vector<int> & e) {
            if (trace != nullptr) {
                trace->predicted(layer, e);
            }
            streamer.prefetch(layer, e);
        });
        prefetch = std::make_unique<detail::PrefetchPolicy>(
            config.prefetch == Prefetch::Auto ? detail::PrefetchPolicy::Mode::Auto : detail::PrefetchPolicy::Mode::Predict);
        info.prefetch = to_string(config.prefetch);
        if (!seam->can_read_ahead()) {
            info.prefetch_note = "no two consecutive layers with router weights (blk.N.ffn_gate_inp.weight): nothing to predict from";
        }
    }
}

// One decode with the seam observing: every weight the graph uses is recorded, experts by name.
// The experts it routes to are read through llama.cpp's mapping this once.
void Engine::Impl::warm_up_and_capture() {
    seam->set_mode(detail::Seam::Mode::Capture);
    llama_token token = llama_vocab_bos(vocab);
    if (token == LLAMA_TOKEN_NULL) {
        token = 0;
    }
    int rc = llama_decode(ctx.get(), llama_batch_get_one(&token, 1));
    if (rc == 0 && mtp) {  // the head's own layer (its experts) runs only in the draft context
        mtp->warm_up(token, [&rc](llama_pos, int, const std::function<int()> & run) { rc = run(); });
    }
    seam->set_mode(detail::Seam::Mode::Off);
    llama_memory_clear(llama_get_memory(ctx.get()), true);
    if (rc != 0) {
        throw Error("the warm-up decode failed (llama_decode returned " + std::to_string(rc) + ")");
    }
}

// The cache budget from the memory really there, now that the dense weights are loaded and the
// KV cache and compute buffers are allocated (detail/memory_budget.h says how).
void Engine::Impl::size_cache() {
    detail::Streamer & streamer = *streaming.streamer;
    // Loading left the file's pages in the page cache; the experts come by O_DIRECT (or into the
    // mirror) and the dense weights are mapped, so those pages only crowd a memory limit. Under one,
    // every page the cache's pool took later would first make the kernel reclaim one of them, and
    // pages freed one by one come back scattered: a slice's read then has ~50 physical segments
    // instead of ~8, and on a virtualized disk each segment costs (docs/memory.md).
    for (const auto & file : streaming.files) {
        file->drop_unmapped_page_cache();
    }
    detail::Footprint footprint;
    for (const detail::RuntimeBuffer & b : seam->runtime_buffers()) {
        (b.scratch ? footprint.scratch : footprint.to_touch).push_back({b.data, b.size});
    }
    if (config.dense == DenseMode::Mmap) {  // with dense=anon they were read into the mirror already
        std::vector<detail::DrafterPages> head_pages;
        for (const auto & c : seam->captured()) {
            if (c.is_expert || !c.host) {  // a worker's weights are not this process's memory
                continue;
            }
            // An MTP head's (its layers follow the trunk's): they sleep with it (hold_drafter).
            const bool head = mtp && !mtp->separate_model() && detail::block_of(c.name) >= info.n_layer;
            (head ? footprint.drafter : footprint.to_touch).push_back({detail::Seam::data(c), c.nbytes});
            const detail::TensorLocation * loc = head ? gguf->find(c.name) : nullptr;
            if (loc != nullptr) {
                head_pages.push_back({gguf->files()[loc->file], detail::Seam::data(c), c.nbytes, loc->offset});
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
    detail::CacheShape shape;
    shape.n_expert = static_cast<uint64_t>(info.n_expert);
    shape.n_expert_used = static_cast<uint64_t>(info.n_expert_used);
    shape.parallel = config.parallel;
    shape.prefetch = config.prefetch != Prefetch::Off;
    shape.widest_expert_bytes = widest_layer;
    shape.projections = projections;
    shape.page_size = info.page_size;
    footprint.in_flight_bytes = detail::in_flight_bytes(shape);
    footprint.mappings_cap_bytes = detail::mappings_cap_bytes(detail::mappings_left(), projections, streamer.n_layers(),
                                                              streamer.cache().bytes_per_token_slot(), info.expert_bytes);
    memory = std::make_unique<detail::MemoryBudget>(config, std::move(footprint), streamer.cache().bytes_per_token_slot());
    // A prompt's compute buffers are written only while it is decoded, and the cache makes room for them then
    // (before_prompt): the ubatch is what that room affords, so a context sized for a long prompt in one ubatch
    // cannot take a small board over its limit (a fixed or no cache has nothing to give: its ubatch is as
    // asked, and a limit too small for it is an error below). A smaller one is said: a resident reference
    // must use it too (llama.cpp's float results may depend on the ubatch split).
    if (config.cache_mb == kAuto) {
        prompt_ubatch = memory->fit_prompt_ubatch(config.ubatch, streamer.pool_held_bytes());
    }
    detail::BudgetReport report = memory->initial(detail::read_memory());
    if (prompt_ubatch < config.ubatch) {
        info.ubatch = prompt_ubatch;
        report.note += std::string(report.note.empty() ? "" : "; ") + "prompts are decoded in ubatches of " +
                       std::to_string(prompt_ubatch) + " tokens, not " + std::to_string(config.ubatch) +
                       ": the memory limit cannot hold the compute buffers of more";
    }
    info.cache_mode = config.cache_mb == 0 ? "off" : config.cache_mb == kAuto ? "auto" : "fixed";
    info.cache_budget_mb = static_cast<double>(report.budget) / 1048576.0;
    info.cache_note = report.note;
    info.memory_limit_source = report.limit_source;
    info.memory_limit_mb = static_cast<double>(report.limit) / 1048576.0;
    info.memory_headroom_mb = static_cast<double>(report.headroom) / 1048576.0;
    info.memory_pending_mb = static_cast<double>(report.pending) / 1048576.0;
    info.cache_adaptive = memory->adaptive();
    if (!report.note.empty()) {
        info.warning += std::string(info.warning.empty() ? "" : "; ") + report.note;
    }
    streaming.pool->set_huge_pages(detail::pool_wants_huge_pages(report.budget, info.expert_bytes));
    streamer.set_budget(report.budget);
}

}  // namespace bmoe
