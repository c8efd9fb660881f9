#include "bmoe/engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "bmoe/build_info.h"
#include "bmoe/error.h"
#include "bmoe/recipes.h"
#include "engine/context.h"
#include "engine/drafter.h"
#include "engine/model.h"
#include "engine/sequences.h"
#include "engine/streaming.h"
#include "engine/tokens.h"
#include "model/llama_runtime.h"
#include "core/telemetry.h"

namespace bmoe {
namespace {

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

// A stall past the deadline; with `hang:N+` every read stalls, and just past it is enough (each stalled read holds
// a lane that long, closing the engine waits for the last one).
FaultInjection fault_with_deadline(const StreamConfig & c) {
    FaultInjection fault = fault_of(c);
    fault.hang_s = c.io_timeout > 0 ? static_cast<double>(c.io_timeout) + (fault.onward ? 0.5 : 2) : 5;
    return fault;
}


}  // namespace

// The facade's state: the components, declared in the order they may be freed in reverse. The file outlives the
// streaming parts built over its map; those outlive the llama_model whose expert tensors point into them; the
// context, the drafter over it and the slots go first (docs/engine.md).
struct Engine::Impl {
    StreamConfig config;
    RunInfo info;
    std::unique_ptr<detail::ModelSource> file;
    std::unique_ptr<detail::Streaming> streaming;
    std::unique_ptr<detail::Model> model;
    std::unique_ptr<detail::Context> context;
    std::unique_ptr<detail::Drafter> drafter;
    std::unique_ptr<detail::Sequences> sequences;

    void open(const std::string & path);
    void record_settings(const std::string & path);
    void stream(const Recipe & recipe);
    // The context was cleared or replaced: no slot holds anything, the head restarts.
    void forget() {
        sequences->forget_all();
        drafter->clear();
    }
    detail::Slot & lone() const { return sequences->at(0); }
};

// Opening, in order: the settings checked and recorded, the file's header read and checked, the RPC
// layers placed, the model loaded and its context made, the drafter; while streaming then the warm-up capture,
// the mirror and lanes, the cache's budget and the seam's callbacks. The checks that need only the file come
// before the model loads.
void Engine::Impl::open(const std::string & path) {
    validate(config);
    detail::ensure_llama_backend();
    streaming = std::make_unique<detail::Streaming>(config, fault_with_deadline(config));
    record_settings(path);
    file = std::make_unique<detail::ModelSource>(path, config, info);
    const Recipe recipe_row = recipe_for(info.architecture);
    const Recipe * recipe = config.stream ? &recipe_row : nullptr;
    model = std::make_unique<detail::Model>(path, config, *file, recipe, info);
    if (config.stream) {
        streaming->make_seam(*recipe);
    }
    context = std::make_unique<detail::Context>(config, *file, *model, *streaming, info);
    drafter = std::make_unique<detail::Drafter>(config, *file, *model, *context, *streaming, info);
    sequences = std::make_unique<detail::Sequences>(config, *file, *model, *context, *streaming, *drafter, info);
    if (!config.stream) {
        file->gguf().check_same_as_paths();  // llama.cpp opened the files by path: the same ones?
        info.cache_mode = "off";
        info.rss_after_load = detail::rss_bytes();
        return;
    }
    stream(*recipe);
    file->gguf().check_same_as_paths();  // llama.cpp and the lanes opened the files by path: the same ones?
    info.rss_after_load = detail::rss_bytes();
}

// Streaming's open steps, after the context and the drafter (the warm-up captures a head's graph too).
void Engine::Impl::stream(const Recipe & recipe) {
    streaming->capture_weights(recipe, *file, context->get(), drafter->mtp(), model->vocab());
    streaming->attach(*file, info);
    streaming->stream_only_local_layers(*file, info);
    context->set_prompt_ubatch(streaming->size_cache(*file, drafter->mtp(), info));
    streaming->choose_expert_kernels(info);
    if (streaming->holds_every_expert(info)) {
        context->spin_compute_threads();
    }
    streaming->route_to_streamer(context->get(), drafter->mtp());
    streaming->set_up_read_ahead(info);
    streaming->start();
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
    // Resident, auto is all (llama.cpp's own choice); streaming resolves it once the cache is sized.
    info.repack = to_string(config.repack == Repack::Auto && !config.stream ? Repack::All : config.repack);
    info.overlap = streaming->overlap();
    info.hook_compiled_in = build_info().expert_ready_hook;
    info.ctx = config.ctx;
    info.batch = config.batch;
    info.ubatch = config.ubatch;
    info.fault = describe(streaming->fault());
    info.speculative = to_string(config.speculative);
    info.io_timeout_s = static_cast<double>(config.io_timeout);
    info.verify_slices = config.verify_slices && config.stream;
    info.parse_special = config.parse_special;
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

const detail::Model & Engine::model() const { return *live().model; }

std::vector<int32_t> Engine::tokenize(const std::string & text, bool add_special, bool parse_special) const {
    return detail::guarded("tokenizing the prompt", [&] {
        const llama_vocab * vocab = live().model->vocab();
        const auto len = static_cast<int32_t>(text.size());
        std::vector<llama_token> out(text.size() + 8);
        int32_t n = llama_tokenize(vocab, text.c_str(), len, out.data(), static_cast<int32_t>(out.size()), add_special,
                                   parse_special);
        if (n < 0) {
            out.resize(static_cast<size_t>(-n));
            n = llama_tokenize(vocab, text.c_str(), len, out.data(), static_cast<int32_t>(out.size()), add_special,
                               parse_special);
        }
        out.resize(static_cast<size_t>(std::max(n, 0)));
        return out;
    });
}

std::string Engine::detokenize(const std::vector<int32_t> & tokens) const {
    return detail::guarded("turning tokens into text", [&] {
        const llama_vocab * vocab = live().model->vocab();
        std::string text;
        for (const int32_t t : tokens) {
            text += detail::token_piece(vocab, t);
        }
        return text;
    });
}

int32_t Engine::vocab_size() const { return llama_vocab_n_tokens(live().model->vocab()); }

std::string Engine::chat_template() const {
    const char * tmpl = llama_model_chat_template(live().model->get(), nullptr);
    return tmpl == nullptr ? std::string() : std::string(tmpl);
}

int32_t Engine::begin(const std::vector<int32_t> & prompt, const SamplingParams & sampling, bool want_logits,
                      bool reuse_kv) {
    return live().sequences->begin(0, prompt, sampling, want_logits, reuse_kv, true);
}

bool Engine::next(StepResult & out) { return live().sequences->next(out); }

const std::vector<int32_t> & Engine::context_tokens() const { return live().lone().in_context; }

void Engine::reset() {
    Impl & d = live();
    d.context->clear();
    d.forget();
}

uint64_t Engine::warm_cache_memory(uint64_t max_bytes) {
    Impl & d = live();
    return d.streaming->warm(max_bytes, d.info.expert_bytes);
}

namespace {
// State files hold one sequence's tokens: refused, in this one place, beside --parallel's slots.
void check_one_sequence(const StreamConfig & config) {
    if (config.parallel > 1) {
        throw Error("session state files hold one conversation: not with --parallel " +
                    std::to_string(config.parallel) + " (its slots keep their own contexts)");
    }
}
}  // namespace

void Engine::save_state(const std::string & path) const {
    Impl & d = live();
    check_one_sequence(d.config);
    d.context->save_state(path, d.lone().in_context);
}

void Engine::load_state(const std::string & path) {
    Impl & d = live();
    check_one_sequence(d.config);
    std::vector<llama_token> tokens;
    try {
        tokens = d.context->load_state(path);
    } catch (...) {
        d.forget();
        throw;
    }
    d.forget();  // the head restarts where the target's next decode starts
    d.lone().in_context = std::move(tokens);
}

int32_t Engine::score_batch() const { return live().context->score_batch(); }

std::vector<PositionLogprobs> Engine::score_positions(const std::vector<int32_t> & tokens, int n_top) {
    return score_positions(tokens, n_top, 0, static_cast<int32_t>(tokens.size()), false);
}

std::vector<PositionLogprobs> Engine::score_positions(const std::vector<int32_t> & tokens, int n_top, int32_t first,
                                                      int32_t count, bool batched) {
    Impl & d = live();
    return d.context->score(tokens, n_top, first, count, batched, d.lone().in_context, [this] { reset(); });
}

std::vector<float> Engine::score(const std::vector<int32_t> & tokens) {
    std::vector<float> out;
    for (const PositionLogprobs & p : score_positions(tokens, 0)) {
        out.push_back(p.chosen.logprob);
    }
    return out;
}

int32_t Engine::n_slots() const { return live().config.parallel; }

int32_t Engine::slot_begin(int32_t slot, const std::vector<int32_t> & prompt, const SamplingParams & sampling,
                           bool want_logits, bool reuse_kv) {
    return live().sequences->begin(slot, prompt, sampling, want_logits, reuse_kv, false);
}

void Engine::slot_stop(int32_t slot) { live().sequences->stop(slot); }

void Engine::slot_clear(int32_t slot) { live().sequences->clear(slot); }

const std::vector<int32_t> & Engine::slot_tokens(int32_t slot) const { return live().sequences->at(slot).in_context; }

bool Engine::slot_active(int32_t slot) const { return live().sequences->at(slot).active; }

BatchStep Engine::step_slots() { return live().sequences->step(); }

}  // namespace bmoe
