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
#include "engine/engine_impl.h"
#include "model/llama_runtime.h"
#include "core/telemetry.h"

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
