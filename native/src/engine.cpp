#include "bmoe/engine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>

#include "bmoe/build_info.h"
#include "bmoe/error.h"
#include "bmoe/recipes.h"
#include "engine_impl.h"
#include "expert_names.h"
#include "llama_runtime.h"
#include "seam_drop.h"
#include "telemetry.h"

namespace bmoe {
namespace {

using detail::Clock;
using detail::ms_since;

// Beyond each row's own bounds (config.cpp): the settings that only make sense together.
void validate(const StreamConfig & c) {
    check_settings(c);
    if (c.drop_cold > 0 && !c.stream) {
        throw Error("drop_cold skips experts that streaming would have to read: it needs streaming");
    }
    if (c.prefetch == Prefetch::Predict && !c.stream) {  // auto: simply off without streaming
        throw Error("prefetch reads streamed experts ahead: it needs streaming (drop --no-stream or --prefetch)");
    }
    if (c.verify_slices && c.stream && c.slice_sums.empty()) {
        throw Error("verify_slices needs the model's slice checksums: run `bmoe-edge verify-model MODEL` once "
                    "to write them");
    }
    if (!c.rpc_split.empty() && c.rpc.empty()) {
        throw Error("--rpc-split needs RPC workers (--rpc)");
    }
}

// The config's fault (an explicit field: nothing sets it but a caller that means it). BMOE_FAULT=<kind>:N
// is honoured only in a build made for testing (BMOE_TEST_FAULTS: scripts/setup.sh's development
// build): an environment a production engine inherits must never make it garble, fail or stall reads.
FaultInjection fault_of(const StreamConfig & c) {
#ifdef BMOE_TEST_FAULTS
    const char * env = std::getenv("BMOE_FAULT");
    if (c.fault.empty() && env != nullptr && *env != '\0') {
        return parse_fault(env, "BMOE_FAULT");
    }
#endif
    return parse_fault(c.fault, "fault");
}

int64_t meta_int(const llama_model * model, const std::string & key) {
    char buf[64];
    return llama_model_meta_val_str(model, key.c_str(), buf, sizeof(buf)) < 0 ? 0 : std::atoll(buf);
}

#ifdef BMOE_HAVE_LAZY_TENSOR_SUFFIXES
// The names llama.cpp must map lazily so loading does not read the experts (patch 0002). A lazy
// tensor always lands in this process's CPU buffer, whatever device its layer is on: with RPC
// workers only the layers kept here (the first `local_layers`) are named, each in full.
std::vector<std::string> lazy_suffixes(const Recipe & recipe, int local_layers) {
    std::vector<std::string> out;
    for (const auto & s : recipe.expert_suffixes) {
        if (local_layers < 0) {
            out.push_back("." + s + ".weight");
        }
        for (int il = 0; il < local_layers; ++il) {  // "blk.1.x" does not end "blk.11.x": no false match
            out.push_back("blk." + std::to_string(il) + "." + s + ".weight");
        }
    }
    return out;
}
#endif

// The model's expert count from its tensor table: known before llama.cpp loads (and would assert
// on an expert_used_count override above it).
int64_t experts_in_file(const detail::GgufMap & gguf, const std::string & architecture) {
    const Recipe recipe = recipe_for(architecture);
    for (int il = 0; il < 4096; ++il) {
        for (const std::string & suffix : recipe.expert_suffixes) {
            if (const detail::TensorLocation * t = gguf.find("blk." + std::to_string(il) + "." + suffix + ".weight")) {
                return static_cast<int64_t>(t->n_slices);
            }
        }
    }
    return 0;
}

}  // namespace

// Opening, in order: the settings checked and recorded, the file's header read and checked, the RPC
// layers placed, the model loaded and its context made; while streaming then the warm-up capture,
// the mirror and lanes, the cache's budget and the seam's callbacks. The checks that need only the
// file come before load_model.
void Engine::Impl::open(const std::string & path) {
    validate(config);
    fault = fault_of(config);
    // A stall past the deadline; with `hang:N+` every read stalls, and just past it is enough (each
    // stalled read holds a lane that long, closing the engine waits for the last one).
    fault.hang_s = config.io_timeout > 0 ? static_cast<double>(config.io_timeout) + (fault.onward ? 0.5 : 2) : 5;
    // auto: on where this build has the hook and no other engine of this process holds it (process-wide)
    overlap = config.overlap == Toggle::On ||
              (config.overlap == Toggle::Auto && build_info().expert_ready_hook && !overlap_in_use());
    rpc_endpoints = config.rpc.empty() ? std::vector<std::string>{} : parse_endpoints(config.rpc);
    rpc_split = config.rpc_split.empty() ? std::vector<double>{} : parse_weights(config.rpc_split);
    detail::ensure_llama_backend();

    record_settings(path);
    open_route_trace();
    read_file_header(path);
    check_lossy_settings(path);
    const Recipe recipe_row = recipe_for(info.architecture);
    const Recipe * recipe = config.stream ? &recipe_row : nullptr;
    refuse_unstreamable(path, recipe_row);
    place_layers_on_workers();
    load_model(path, recipe);
    read_model_shape(path);
    if (config.stream) {
        seam = std::make_unique<detail::Seam>(*recipe);
    }
    create_context();
    set_up_speculation();
    if (!config.stream) {
        gguf->check_same_as_paths();  // llama.cpp opened the files by path: the same ones?
        info.cache_mode = "off";
        info.rss_after_load = detail::rss_bytes();
        return;
    }
    capture_weights(*recipe);
    streaming = detail::attach_streaming(*gguf, *seam, config, fault, info);
    stream_only_local_layers();
    size_cache();
    route_to_streamer();
    set_up_read_ahead();
    seam->set_mode(detail::Seam::Mode::Stream);
    gguf->check_same_as_paths();  // llama.cpp and the lanes opened the files by path: the same ones?
    info.rss_after_load = detail::rss_bytes();
}

// The run info's copy of the settings, before anything can fail on the file.
void Engine::Impl::record_settings(const std::string & path) {
    info.model = path;
    info.streaming = config.stream;
    info.threads = config.threads;
    info.io_threads = config.io_threads;
    info.read_path_requested = to_string(config.read_path);
    info.kernel_page_size = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    info.page_size = config.page_kb > 0 ? static_cast<uint64_t>(config.page_kb) * 1024 : info.kernel_page_size;
    info.dense = to_string(config.dense);
    info.overlap = overlap;
    info.hook_compiled_in = build_info().expert_ready_hook;
    info.ctx = config.ctx;
    info.batch = config.batch;
    info.ubatch = config.ubatch;
    prompt_ubatch = config.ubatch;
    info.flash_attn = config.flash_attn;
    info.fault = describe(fault);
    info.speculative = to_string(config.speculative);
    info.io_timeout_s = static_cast<double>(config.io_timeout);
    info.verify_slices = config.verify_slices && config.stream;
    info.parse_special = config.parse_special;
}

void Engine::Impl::open_route_trace() {
    if (!config.route_trace.empty()) {
        if (!config.stream) {
            throw Error("the route trace needs streaming: the routed experts are read where the engine streams them");
        }
        route_trace = std::make_unique<detail::RouteTrace>(config.route_trace);  // a bad path fails now
    }
}

void Engine::Impl::read_file_header(const std::string & path) {
    gguf = std::make_unique<detail::GgufMap>(path);  // header, shards, bounds: before any load
    info.architecture = printable(gguf->architecture());
    info.n_files = static_cast<int>(gguf->files().size());
    info.file_bytes = gguf->total_bytes();
}

// --n-expert-used against the file's expert count, and the run info's `lossy` label.
void Engine::Impl::check_lossy_settings(const std::string & path) {
    if (config.n_expert_used != kAuto) {
        const int64_t n_expert = experts_in_file(*gguf, info.architecture);
        if (n_expert == 0) {
            throw Error(path + ": --n-expert-used needs a MoE model of an architecture the engine knows ('" +
                        info.architecture + "' is not one)");
        }
        if (config.n_expert_used < 1 || config.n_expert_used > n_expert) {
            throw Error("n_expert_used must be between 1 and " + std::to_string(n_expert) +
                        " (the model's experts), got " + std::to_string(config.n_expert_used));
        }
    }
    info.lossy = lossy_settings(config);  // the rows marked Output::Lossy (bmoe/config.h)
}

void Engine::Impl::refuse_unstreamable(const std::string & path, const Recipe & recipe_row) {
    for (const Recipe & r : recipes()) {  // streamed or not: it has no KV cache of its own
        if (r.draft_model == info.architecture) {
            throw Error(path + ": a '" + info.architecture + "' file is a draft model: it decodes over a '" +
                        r.architecture + "' model's KV cache; give it to that model as --draft-model");
        }
    }
    if (config.stream && !recipe_row.refused.empty()) {  // said before a byte of weights is loaded
        throw Error(path + ": architecture '" + info.architecture + "' cannot be streamed: " + recipe_row.refused +
                    "; run it with --no-stream (bmoe-edge archs)");
    }
}

// Which whole layers go to which RPC worker (the workers probed and registered first).
void Engine::Impl::place_layers_on_workers() {
    if (!rpc_endpoints.empty()) {
        rpc = std::make_unique<detail::RpcWorkers>(rpc_endpoints, static_cast<double>(config.rpc_timeout));  // probed before
        placement = rpc->place(*gguf, rpc_split, config.stream);
        info.rpc_workers = static_cast<int>(rpc_endpoints.size());
        info.main_layers = placement.main_layers;
        info.placement = detail::describe(placement, rpc_endpoints, config.stream);
    }
}

// Layers and experts as llama.cpp loaded them; a dense model has nothing to stream.
void Engine::Impl::read_model_shape(const std::string & path) {
    info.n_layer = llama_model_n_layer(model.get());
    info.n_expert = static_cast<int>(meta_int(model.get(), info.architecture + ".expert_count"));
    info.n_expert_used = config.n_expert_used > 0  // the file's count, unless overridden (lossy)
                             ? config.n_expert_used
                             : static_cast<int>(meta_int(model.get(), info.architecture + ".expert_used_count"));
    if (config.stream && info.n_expert == 0) {
        throw Error(path + ": '" + info.architecture +
                    "' model without experts (dense): nothing to stream; run it with --no-stream");
    }
}

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

void Engine::Impl::load_model(const std::string & path, const Recipe * recipe) {
    llama_model_params params = llama_model_default_params();
    params.load_mode = LLAMA_LOAD_MODE_MMAP;
    params.use_extra_bufts = false;  // repacked experts would not be the file's bytes
    params.n_gpu_layers = 0;
    // The model's MTP head, where speculation may use it (never on RPC workers: speculation.cpp).
    params.load_mtp = (config.speculative == Speculative::Mtp || config.speculative == Speculative::Auto) &&
                      rpc_endpoints.empty();
    std::vector<ggml_backend_dev_t> devices;
    std::vector<float> split;
    if (rpc) {  // llama.cpp's own placement: the first layers here, then each worker's run, in order
        devices = rpc->devices();
        split = detail::RpcWorkers::tensor_split(placement, llama_max_devices());
        params.devices = devices.data();
        params.tensor_split = split.data();
        params.split_mode = LLAMA_SPLIT_MODE_LAYER;
        params.n_gpu_layers = detail::RpcWorkers::offloaded_layers(placement);
    }
    std::vector<std::string> suffixes;
    std::vector<const char *> suffix_ptrs;
#ifdef BMOE_HAVE_LAZY_TENSOR_SUFFIXES
    if (recipe != nullptr) {
        suffixes = lazy_suffixes(*recipe, rpc ? placement.main_layers : -1);
        for (const auto & s : suffixes) {
            suffix_ptrs.push_back(s.c_str());
        }
        suffix_ptrs.push_back(nullptr);
        params.lazy_tensor_suffixes = suffix_ptrs.data();
        info.lazy_load = true;
    }
#else
    (void) recipe;
#endif
    std::vector<llama_model_kv_override> overrides;
    if (config.n_expert_used > 0) {  // lossy: fewer experts per token, through llama.cpp's own override
        llama_model_kv_override o{};
        o.tag = LLAMA_KV_OVERRIDE_TYPE_INT;
        std::snprintf(o.key, sizeof(o.key), "%s.expert_used_count", info.architecture.c_str());
        o.val_i64 = config.n_expert_used;
        overrides.push_back(o);
        overrides.push_back(llama_model_kv_override{});  // an empty key ends the list
        params.kv_overrides = overrides.data();
    }
    const uint64_t read0 = detail::storage_read_bytes();
    const uint64_t faults0 = detail::major_faults();
    const auto t0 = Clock::now();
    detail::clear_llama_error();
    model.reset(llama_model_load_from_file(path.c_str(), params));
    if (!model) {
        const std::string why = detail::last_llama_error();
        throw Error(path + ": llama.cpp could not load the model" + (why.empty() ? "" : " (" + why + ")"));
    }
    info.load_ms = ms_since(t0);
    info.load_bytes_read = detail::storage_read_bytes() - read0;
    info.load_major_faults = detail::major_faults() - faults0;
    vocab = llama_model_get_vocab(model.get());
}

llama_context_params Engine::Impl::context_params() const {
    llama_context_params params = llama_context_default_params();
    // --parallel: one KV stream per sequence (not unified), each the whole -c: a sequence's attention runs
    // over its own cells, in the order it would alone, so a batched request's tokens are its own.
    params.n_ctx = static_cast<uint32_t>(config.ctx) * static_cast<uint32_t>(config.parallel);
    params.n_batch = static_cast<uint32_t>(config.batch);
    params.n_ubatch = static_cast<uint32_t>(config.ubatch);
    params.n_seq_max = static_cast<uint32_t>(config.parallel);
    params.kv_unified = false;
    // 0 = auto: the rule, and why, beside the threads row (config.cpp).
    const int cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
    const int threads = compute_threads(config.threads, config.stream, cores);
    params.n_threads = threads;
    params.n_threads_batch = threads;  // a long prompt takes every core only around its own batch (step_once)
    params.flash_attn_type = config.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    params.no_perf = true;
    // A recurrent state cannot be cut back to the accepted drafts; where llama.cpp can keep a snapshot
    // per position (qwen35moe, lfm2moe, nemotron_h_moe, ...; it clamps to 0 elsewhere), one per draft.
    const bool recurrent = llama_model_is_recurrent(model.get()) || llama_model_is_hybrid(model.get());
    // auto on such a trunk: only for an MTP head (speculation.cpp), the snapshots cost memory.
    const bool speculating = config.speculative == Speculative::Ngram || config.speculative == Speculative::Mtp ||
                             (config.speculative == Speculative::Auto && detail::MtpDraft::heads(model.get()) > 0);
    params.n_rs_seq = recurrent && speculating ? static_cast<uint32_t>(config.draft_max) : 0;
    if (seam) {
        params.cb_eval = &detail::Seam::callback;
        params.cb_eval_user_data = seam.get();
    }
    return params;
}

// The target context; an MTP head's draft context is made with the same parameters (speculation.cpp).
void Engine::Impl::create_context() {
    const llama_context_params params = context_params();
    info.threads = params.n_threads;
    decode_threads = params.n_threads;
    // 0 = auto while streaming: a long prompt's batch is compute-bound (each of its ubatches computes for
    // seconds per layer while that layer's reads, started by its router, land in a fraction of it), so it
    // computes on every core, as a resident run does; the lanes sleep in the kernel on their reads and
    // need little CPU. With one core left to them, a 512-token prompt at the Pi 5 Gen 2 class took 1.94x
    // the resident prefill, with 23 ms of its 27.8 s stalled on reads (bench-data/2026-12-02).
    const int cores = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
    prompt_threads = config.threads == 0 && config.stream ? std::max(decode_threads, cores) : decode_threads;
    detail::clear_llama_error();
    ctx.reset(llama_init_from_model(model.get(), params));
    if (!ctx) {
        const std::string why = detail::last_llama_error();
        throw Error("llama.cpp could not create a context" + (why.empty() ? "" : " (" + why + ")"));
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
    // The layer being computed and the one being read (overlap), and with read-ahead the next
    // layer's guesses, each slice rounded out to units.
    // --parallel: a step's sequences route to up to N times a token's experts per layer (their union).
    const uint64_t routed = std::min<uint64_t>(static_cast<uint64_t>(info.n_expert),
                                               static_cast<uint64_t>(info.n_expert_used) * config.parallel);
    const uint64_t slices = routed * projections;
    footprint.in_flight_bytes = (config.prefetch != Prefetch::Off ? 3 : 2) * (routed * widest_layer + slices * 2 * info.page_size);
    // Each cached slice is a mapping moved into the mirror, splitting the reservation around it,
    // and leaves the same split behind in the pool.
    const uint64_t maps_free = detail::mappings_left();
    const uint64_t per_expert_maps = 4 * projections;
    if (maps_free != UINT64_MAX && per_expert_maps > 0) {
        const uint64_t cap = maps_free / per_expert_maps / std::max(1, streamer.n_layers()) *
                             streamer.cache().bytes_per_token_slot();
        if (cap < info.expert_bytes) {  // only a limit where the cache could otherwise hold more
            footprint.mappings_cap_bytes = cap;
        }
    }
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
    // Huge pages make a slice's read a few DMA segments; they pay where slices are read every token.
    // A cache that holds every expert reads nothing once full, and a reclaimer working through
    // physical memory (this VM's DAMON pageout) splits huge pages: 0.63 of resident against 0.98 in
    // plain pages (docs/memory.md). There, plain pages.
    streaming.pool->set_huge_pages(report.budget < info.expert_bytes);
    streamer.set_budget(report.budget);
}

Engine::Engine(const std::string & model_path, const StreamConfig & config) : impl_(std::make_unique<Impl>()) {
    impl_->config = config;
    detail::guarded("opening the model", [&] { impl_->open(model_path); });
}

Engine::~Engine() = default;

Engine::Impl & Engine::live() const {
    if (!impl_) {
        throw Error("the engine is closed");
    }
    return *impl_;
}

void Engine::close() { impl_.reset(); }

const RunInfo & Engine::run_info() const { return live().info; }

}  // namespace bmoe
