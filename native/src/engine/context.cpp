#include "engine/context.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "bmoe/error.h"
#include "draft/mtp_draft.h"
#include "model/llama_runtime.h"

namespace bmoe::detail {

namespace {

// One call's graph run whole when Streaming::begin_graph says it can, the experts it used counted after it (a
// failed call's too).
class WholeGraph {
public:
    explicit WholeGraph(Streaming & streaming) : streaming_(streaming), whole_(streaming.begin_graph()) {}
    ~WholeGraph() { streaming_.end_graph(whole_); }
    WholeGraph(const WholeGraph &) = delete;
    WholeGraph & operator=(const WholeGraph &) = delete;

private:
    Streaming & streaming_;
    const bool whole_;
};

// A batch of `n` entries from `first`, freed with it.
struct CallBatch {
    llama_batch batch;
    CallBatch(const BatchEntry * entries, int32_t n) : batch(llama_batch_init(n, 0, 1)) {
        for (int32_t i = 0; i < n; ++i) {
            batch.token[i] = entries[i].token;
            batch.pos[i] = entries[i].pos;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = entries[i].seq;
            batch.logits[i] = entries[i].logits ? 1 : 0;
        }
        batch.n_tokens = n;
    }
    ~CallBatch() { llama_batch_free(batch); }
    CallBatch(const CallBatch &) = delete;
    CallBatch & operator=(const CallBatch &) = delete;
};

int online_cores() { return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN))); }

// Whether the context runs flash attention, as llama.cpp says in the lines it logs at its creation: what it was
// asked for after an architecture's veto ("flash_attn = enabled|disabled|auto"; Grok turns it off), then for auto
// its probe's verdict ("Flash Attention enabled" or "... not supported, set to disabled").
bool flash_attn_resolved(const std::string & creation_log, llama_flash_attn_type requested) {
    if (creation_log.find("Flash Attention not supported") != std::string::npos) {
        return false;
    }
    if (creation_log.find("Flash Attention enabled") != std::string::npos) {
        return true;
    }
    const size_t key = creation_log.find("flash_attn ");
    const size_t eq = key == std::string::npos ? key : creation_log.find('=', key);
    const size_t word = eq == std::string::npos ? eq : creation_log.find_first_not_of(' ', eq + 1);
    if (word == std::string::npos) {
        return requested != LLAMA_FLASH_ATTN_TYPE_DISABLED;  // the pin stopped saying
    }
    return creation_log.compare(word, 7, "enabled") == 0;
}

}  // namespace

// The target context; an MTP head's draft context is made with the same parameters (drafter.cpp).
Context::Context(const StreamConfig & config, const ModelSource & file, const Model & model, Streaming & streaming,
                 RunInfo & info)
    : config_(config), file_(file), model_(model), streaming_(streaming), prompt_ubatch_(config.ubatch) {
    const llama_context_params p = params();
    info.threads = p.n_threads;
    decode_threads_ = p.n_threads;
    // 0 = auto while streaming: a long prompt's batch is compute-bound (each of its ubatches computes for
    // seconds per layer while that layer's reads, started by its router, land in a fraction of it), so it
    // computes on every core, as a resident run does; the lanes sleep in the kernel on their reads and
    // need little CPU. With one core left to them, a 512-token prompt at the Pi 5 Gen 2 class took 1.94x
    // the resident prefill, with 23 ms of its 27.8 s stalled on reads (bench-data/2026-12-02).
    prompt_threads_ = config.threads == 0 && config.stream ? std::max(decode_threads_, online_cores()) : decode_threads_;
    clear_llama_error();
    {
        LogCapture log;
        ctx_.reset(llama_init_from_model(model.get(), p));
        info.flash_attn = flash_attn_resolved(log.text(), p.flash_attn_type);
    }
    if (!ctx_) {
        const std::string why = last_llama_error();
        throw Error("llama.cpp could not create a context" + (why.empty() ? "" : " (" + why + ")"));
    }
    attach_pools();
}

// Compute threads that live as long as the context, as llama.cpp's own tools attach them. Without a pool, ggml
// creates and joins its threads for every graph it computes, and the seam splits each decode into a graph per
// layer (its router's top-k computed alone): 2 threads on the 3 GB preset decoded at 0.78x llama-bench's tok/s
// (bench-data/2026-12-05/repack). While streaming, the workers wait for work asleep rather than spinning
// (poll 0): between a layer's graphs its reads are landing, and a spinning thread per core starves the lanes.
void Context::attach_pools() {
    decode_pool_ = make_pool(decode_threads_, !config_.stream);
    prompt_pool_ = make_pool(prompt_threads_, !config_.stream);
    llama_attach_threadpool(ctx_.get(), decode_pool_.get(), prompt_pool_.get());
}

Context::Pool Context::make_pool(int threads, bool spin) {
    ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
    if (!spin) {
        tpp.poll = 0;
    }
    Pool made(ggml_threadpool_new(&tpp));
    if (!made) {
        throw Error("could not start " + std::to_string(threads) + " compute threads");
    }
    return made;
}

// Where the cache holds every expert, a step reads nothing once they are in, and its compute is the whole of
// it: asleep between a layer's graphs, 2 threads decoded the warm 3 GB Q4_K preset at 0.82-0.87x llama-bench,
// spinning as llama.cpp's own (ggml's default poll) at 0.93-0.99x (bench-data/2026-12-05/repack-fa).
void Context::spin_compute_threads() {
    Pool decode = make_pool(decode_threads_, true);
    Pool prompt = make_pool(prompt_threads_, true);
    llama_attach_threadpool(ctx_.get(), decode.get(), prompt.get());
    replaced_pools_[0] = std::exchange(decode_pool_, std::move(decode));
    replaced_pools_[1] = std::exchange(prompt_pool_, std::move(prompt));
}

llama_context_params Context::params() const {
    llama_context_params params = llama_context_default_params();
    // --parallel: one KV stream per sequence (not unified), each the whole -c: a sequence's attention runs
    // over its own cells, in the order it would alone, so a batched request's tokens are its own.
    params.n_ctx = static_cast<uint32_t>(config_.ctx) * static_cast<uint32_t>(config_.parallel);
    params.n_batch = static_cast<uint32_t>(config_.batch);
    params.n_ubatch = static_cast<uint32_t>(config_.ubatch);
    params.n_seq_max = static_cast<uint32_t>(config_.parallel);
    params.kv_unified = false;
    // 0 = auto: the rule, and why, beside the threads row (config.cpp).
    const int threads = compute_threads(config_.threads, config_.stream, online_cores());
    params.n_threads = threads;
    params.n_threads_batch = threads;  // a long prompt takes every core only around its own batch (threads_for)
    // auto is llama.cpp's own (its default): on where the attention's device is the layer's, as on CPU and RPC.
    params.flash_attn_type = config_.flash_attn == Toggle::Off  ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                             : config_.flash_attn == Toggle::On ? LLAMA_FLASH_ATTN_TYPE_ENABLED
                                                                : LLAMA_FLASH_ATTN_TYPE_AUTO;
    params.no_perf = true;
    // A recurrent state cannot be cut back to the accepted drafts; where llama.cpp can keep a snapshot
    // per position (qwen35moe, lfm2moe, nemotron_h_moe, ...; it clamps to 0 elsewhere), one per draft.
    // auto on such a trunk: only for an MTP head (drafter.cpp), the snapshots cost memory.
    const bool speculating = config_.speculative == Speculative::Ngram || config_.speculative == Speculative::Mtp ||
                             (config_.speculative == Speculative::Auto && config_.parallel == 1 &&
                              MtpDraft::heads(model_.get()) > 0);
    params.n_rs_seq = model_.recurrent() && speculating ? static_cast<uint32_t>(config_.draft_max) : 0;
    if (Seam * seam = streaming_.seam()) {
        params.cb_eval = &Seam::callback;
        params.cb_eval_user_data = seam;
    }
    return params;
}

// A long prompt computes on every core; a decode's few tokens wait on their reads, and there a spinning compute
// thread per core starves the lanes.
BatchThreads Context::threads_for(size_t prompt_tokens) const {
    const bool all_cores = prompt_tokens >= static_cast<size_t>(kPromptAllCoresTokens);
    return BatchThreads(ctx_.get(), decode_threads_, all_cores ? prompt_threads_ : decode_threads_);
}

void Context::run_decode(int first_pos, int n, const std::function<int()> & run) {
    RouteTrace * trace = streaming_.route_trace();
    if (trace != nullptr) {
        trace->begin_batch(first_pos, n);
    }
    Streamer * streamer = streaming_.overlap() ? streaming_.streamer() : nullptr;
    if (streamer != nullptr) {
        streamer->clear_failure();
    }
    int rc = 0;
    {
        const RpcWorkers::Watch deadline(file_.rpc());  // a worker that stops answering: one line
        const WholeGraph whole(streaming_);
        rc = run();
    }
    Seam * seam = streaming_.seam();
    const std::string error = seam ? seam->take_error() : std::string();  // taken always: never stale
    if (streamer != nullptr) {
        streamer->drain();  // the last layer's reads; rethrows a failed read
    }
    if (!error.empty()) {
        throw Error(error);
    }
    if (rc != 0) {
        throw Error("llama_decode failed (" + std::to_string(rc) + ")");
    }
}

void Context::decode(const std::vector<BatchEntry> & entries, const std::function<void(size_t, int)> & after_call) {
    const int per_call = batch_per_call();
    for (size_t done = 0; done < entries.size();) {
        const auto n = static_cast<int32_t>(std::min<size_t>(entries.size() - done, static_cast<size_t>(per_call)));
        CallBatch b(entries.data() + done, n);
        // The route trace numbers a sequence's tokens by position, a batch of several sequences by row.
        const bool one_sequence = std::all_of(entries.begin() + static_cast<long>(done),
                                              entries.begin() + static_cast<long>(done) + n,
                                              [&](const BatchEntry & e) { return e.seq == entries[done].seq; });
        run_decode(one_sequence ? entries[done].pos : 0, n, [&] { return llama_decode(ctx_.get(), b.batch); });
        after_call(done, n);
        done += static_cast<size_t>(n);
    }
}

void Context::clear() { llama_memory_clear(llama_get_memory(ctx_.get()), true); }

bool Context::cut(llama_seq_id seq, llama_pos from) { return llama_memory_seq_rm(llama_get_memory(ctx_.get()), seq, from, -1); }

std::string Context::logits_bytes(int32_t row, const llama_vocab * vocab) const {
    const float * l = logits(row);
    return {reinterpret_cast<const char *>(l), static_cast<size_t>(llama_vocab_n_tokens(vocab)) * sizeof(float)};
}

void Context::save_state(const std::string & path, const std::vector<llama_token> & tokens) const {
    if (!llama_state_save_file(ctx_.get(), path.c_str(), tokens.data(), tokens.size())) {
        throw Error("could not write the session state to " + path);
    }
}

std::vector<llama_token> Context::load_state(const std::string & path) {
    std::vector<llama_token> tokens(static_cast<size_t>(config_.ctx));
    size_t n = 0;
    if (!llama_state_load_file(ctx_.get(), path.c_str(), tokens.data(), tokens.size(), &n)) {
        clear();
        throw Error(path + " is not a session state of this model and context size (or cannot be read)");
    }
    tokens.resize(n);
    return tokens;
}

}  // namespace bmoe::detail
