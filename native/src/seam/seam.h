// The seam with llama.cpp, in one place: the eval callback (capture phase and stream phase) and
// everything that touches ggml_tensor internals (names, strides, buffers, ->data).
//
// Capture: during one warm-up decode, every node's sources are scanned; expert weights are
// recognised as the src[0] of a MUL_MAT_ID (named blk.<il>.<suffix>.weight; the recipe's suffix list
// orders the projections, and a suffix it lacks is appended). Nothing is isolated.
// Stream: the ffn_moe_topk-<il> node is isolated; when the scheduler has computed it, the routed
// expert ids are read (stride-aware: the node is a view) and handed to the router before the
// layer's expert matmuls run. Returning false at ask=false stops the graph: that is how a failed
// read aborts a decode (the error is kept and rethrown by the caller).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bmoe/recipes.h"

struct ggml_tensor;

namespace bmoe::detail {

struct CapturedTensor {
    ggml_tensor * tensor = nullptr;
    std::string name;
    bool is_expert = false;
    int layer = -1;
    int projection = -1;
    uint64_t nbytes = 0;
    uint64_t expert_stride = 0;  // nb[2]
    int n_expert = 0;            // ne[2]
    bool host = true;            // in this process's memory; false: on an RPC worker (never streamed)
    bool repacked = false;       // llama.cpp repacked it at load (CPU_REPACK): anonymous memory, not the file's bytes
};

// A host buffer the graph computes in besides the weights. `scratch`: one of the scheduler's compute
// buffers (what a graph writes and the next one overwrites), as opposed to the KV cache.
struct RuntimeBuffer {
    const void * data = nullptr;
    uint64_t size = 0;
    bool scratch = false;
};

class NextLayerPredictor;
class ColdDropper;

class Seam {
public:
    enum class Mode { Off, Capture, Stream };
    // A layer's routed ids for the whole batch: `per_token` ids for each token, token after token.
    using Router = std::function<void(int layer, const std::vector<int> & experts, int per_token)>;

    // A guess of the experts `layer` will route to, made before its router runs (read-ahead).
    // `read`: read them ahead; else only count what reading them would have read (prefetch_policy.h).
    using ReadAhead = std::function<void(int layer, const std::vector<int> & experts, bool read)>;
    enum class Ahead { None, Count, Read };
    // Capture only: a layer's routed experts, before its expert matmuls read them through
    // llama.cpp's mapping (the warm-up decode); advisory, its errors are ignored.
    using RoutedHint = std::function<void(int layer, const std::vector<int> & experts)>;

    explicit Seam(Recipe recipe);
    ~Seam();

    // The ggml_backend_sched_eval_callback to install, with `this` as user data.
    static bool callback(ggml_tensor * t, bool ask, void * user_data);

    void set_mode(Mode mode) { mode_ = mode; }
    void set_router(Router router) { router_ = std::move(router); }
    void set_warm_up_hint(RoutedHint hint) { warm_up_hint_ = std::move(hint); }
    // After capture: guess each next layer's experts from the routers' weights (seam_predict.h)
    // and hand the guess over, in the decodes where set_ahead(Count or Read) is in force.
    void set_read_ahead(ReadAhead read_ahead);
    void set_ahead(Ahead ahead) { ahead_ = ahead; }
    // A graph run whole (Streamer::holds_every_expert): no router isolated, so no split of the graph per layer
    // (each split is a barrier of every compute thread: 4% of a 2-thread decode, bench-data/2026-12-05/whole-graph).
    void set_whole_graph(bool whole) { whole_graph_ = whole; }
    // Guesses only for layers below `n` (the trunk: an MTP head's layer runs in another graph).
    void set_predicted_layers(int n) { predicted_layers_ = n; }
    bool can_read_ahead() const;
    // LOSSY (--drop-cold): rewrite light, cold routed slots before the experts are computed.
    void set_cold_dropper(std::unique_ptr<ColdDropper> dropper);
    // Routed slots dropped since the last call.
    int take_dropped();
    // The layers whose experts this process streams (index = layer). Only their ffn_moe_topk node is
    // isolated: a layer on an RPC worker computes there, in one piece, and its ids are not ours to read.
    // Empty: every layer.
    void set_streamed_layers(std::vector<bool> layers) { streamed_layers_ = std::move(layers); }
    // The router's error from the last decode, if any (and clears it).
    std::string take_error();

    const std::vector<CapturedTensor> & captured() const { return captured_; }
    // The host buffers the graph computes in besides the weights (KV cache, compute buffers), seen in
    // the warm-up: memory the process holds even where the warm-up has not touched it yet.
    const std::vector<RuntimeBuffer> & runtime_buffers() const { return runtime_buffers_; }
    // The compute buffers the last streamed decode's graph ran in (noted at its routers; cleared by
    // begin_decode). Only these may be given back after a prompt: a buffer llama.cpp reallocated
    // since the warm-up is freed memory, and the graph that just ran proves these are live.
    void begin_decode() { last_scratch_.clear(); }
    const std::vector<RuntimeBuffer> & last_scratch() const { return last_scratch_; }
    const Recipe & recipe() const { return recipe_; }

    // The name of the CPU backend's buffer type for repacked weights (its kernels: seam/repacked.h).
    static constexpr const char * kRepackedBufferType = "CPU_REPACK";
    // Throws bmoe::Error unless the tensor sits in llama.cpp's plain CPU buffer with exactly the
    // file's bytes at the start of its data (repacked or converted weights would not).
    static void check_file_layout(const CapturedTensor & t, int fd, uint64_t file_offset);
    static void * data(const CapturedTensor & t);
    static void repoint(const CapturedTensor & t, void * new_data);

private:
    bool on_ask(ggml_tensor * t);
    bool on_computed(ggml_tensor * t);
    void capture_sources(ggml_tensor * t);
    bool adopt_expert_name(CapturedTensor & c);
    void note_runtime_buffer(const ggml_tensor * t);
    void note_scratch(const ggml_tensor * t);
    // ids_ = the routed ids of a computed ffn_moe_topk node; throws bmoe::Error where unreadable.
    int read_ids(ggml_tensor * t);

    Recipe recipe_;
    Mode mode_ = Mode::Off;
    Router router_;
    RoutedHint warm_up_hint_;
    std::string error_;
    std::vector<CapturedTensor> captured_;
    std::unordered_map<const ggml_tensor *, size_t> seen_;
    std::vector<RuntimeBuffer> runtime_buffers_;
    std::vector<RuntimeBuffer> last_scratch_;
    std::vector<int> ids_;
    ReadAhead read_ahead_;
    std::unique_ptr<NextLayerPredictor> predictor_;
    Ahead ahead_ = Ahead::None;
    bool whole_graph_ = false;
    int predicted_layers_ = 1 << 30;
    std::vector<int> guess_;
    std::unique_ptr<ColdDropper> dropper_;
    int dropped_ = 0;
    std::vector<bool> streamed_layers_;
    bool streams_layer(const char * topk_name) const;
};

class Streamer;

// The process-wide expert-ready hook of patch 0001, registered for one streamer for as long as this
// object lives. The hook is global to ggml-cpu, so only one overlapping engine per process.
class ExpertReadyHook {
public:
    // Throws bmoe::Error when the build has no hook or another engine holds it.
    explicit ExpertReadyHook(Streamer & streamer);
    ~ExpertReadyHook();
    ExpertReadyHook(const ExpertReadyHook &) = delete;
    ExpertReadyHook & operator=(const ExpertReadyHook &) = delete;
};

}  // namespace bmoe::detail
