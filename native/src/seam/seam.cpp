#include "seam/seam.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <exception>

#include <atomic>

#include "bmoe/engine.h"
#include "bmoe/error.h"
#include "model/expert_names.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "seam/seam_drop.h"
#include "seam/seam_predict.h"
#include "stream/streamer.h"

namespace bmoe::detail {
namespace {

constexpr const char * kTopkPrefix = "ffn_moe_topk-";

bool starts_with(const char * s, const char * prefix) { return std::strncmp(s, prefix, std::strlen(prefix)) == 0; }

}  // namespace

Seam::Seam(Recipe recipe) : recipe_(std::move(recipe)) {}
Seam::~Seam() = default;

void Seam::set_read_ahead(ReadAhead read_ahead) {
    read_ahead_ = std::move(read_ahead);
    predictor_ = read_ahead_ ? std::make_unique<NextLayerPredictor>(captured_) : nullptr;
}

void Seam::set_cold_dropper(std::unique_ptr<ColdDropper> dropper) { dropper_ = std::move(dropper); }

int Seam::take_dropped() {
    const int n = dropped_;
    dropped_ = 0;
    return n;
}

bool Seam::can_read_ahead() const { return predictor_ != nullptr && predictor_->any(); }

bool Seam::callback(ggml_tensor * t, bool ask, void * user_data) {
    auto * self = static_cast<Seam *>(user_data);
    return ask ? self->on_ask(t) : self->on_computed(t);
}

bool Seam::on_ask(ggml_tensor * t) {
    switch (mode_) {
        case Mode::Capture:
            capture_sources(t);
            return warm_up_hint_ && starts_with(t->name, kTopkPrefix);  // otherwise observe only
        case Mode::Stream:
            if (starts_with(t->name, kTopkPrefix) && streams_layer(t->name)) {
                note_scratch(t);
                return !whole_graph_;
            }
            return false;
        case Mode::Off:
            return false;
    }
    return false;
}

bool Seam::streams_layer(const char * topk_name) const {
    if (streamed_layers_.empty()) {
        return true;
    }
    const long layer = std::strtol(topk_name + std::strlen(kTopkPrefix), nullptr, 10);
    return layer >= 0 && static_cast<size_t>(layer) < streamed_layers_.size() && streamed_layers_[layer];
}

void Seam::note_runtime_buffer(const ggml_tensor * t) {
    const ggml_tensor * owner = t->view_src != nullptr ? t->view_src : t;
    ggml_backend_buffer_t buffer = owner->buffer;
    if (buffer == nullptr || ggml_backend_buffer_get_usage(buffer) == GGML_BACKEND_BUFFER_USAGE_WEIGHTS ||
        !ggml_backend_buffer_is_host(buffer)) {
        return;
    }
    const void * base = ggml_backend_buffer_get_base(buffer);
    for (const RuntimeBuffer & known : runtime_buffers_) {
        if (known.data == base) {
            return;
        }
    }
    runtime_buffers_.push_back({base, ggml_backend_buffer_get_size(buffer),
                                ggml_backend_buffer_get_usage(buffer) == GGML_BACKEND_BUFFER_USAGE_COMPUTE});
}

void Seam::note_scratch(const ggml_tensor * t) {
    const ggml_tensor * owner = t->view_src != nullptr ? t->view_src : t;
    ggml_backend_buffer_t buffer = owner->buffer;
    if (buffer == nullptr || !ggml_backend_buffer_is_host(buffer) ||
        ggml_backend_buffer_get_usage(buffer) != GGML_BACKEND_BUFFER_USAGE_COMPUTE) {
        return;
    }
    const void * base = ggml_backend_buffer_get_base(buffer);
    for (const RuntimeBuffer & known : last_scratch_) {
        if (known.data == base) {
            return;
        }
    }
    last_scratch_.push_back({base, ggml_backend_buffer_get_size(buffer), true});
}

void Seam::capture_sources(ggml_tensor * node) {
    note_runtime_buffer(node);
    for (ggml_tensor * src : node->src) {
        if (src != nullptr) {
            note_runtime_buffer(src);
        }
        if (src == nullptr || src->view_src != nullptr || src->buffer == nullptr ||
            ggml_backend_buffer_get_usage(src->buffer) != GGML_BACKEND_BUFFER_USAGE_WEIGHTS || seen_.count(src)) {
            continue;
        }
        CapturedTensor c;
        c.tensor = src;
        c.name = ggml_get_name(src);
        c.nbytes = ggml_nbytes(src);
        // An expert tensor is a per-layer weight the graph uses as src[0] of a MUL_MAT_ID, whatever its
        // name: a suffix the recipe does not list joins it, after the listed ones.
        c.repacked = std::strcmp(ggml_backend_buft_name(ggml_backend_buffer_get_type(src->buffer)),
                                 kRepackedBufferType) == 0;
        c.host = ggml_backend_buffer_is_host(src->buffer) || c.repacked;  // repacked: host memory, not "host" to ggml
        c.is_expert = node->op == GGML_OP_MUL_MAT_ID && node->src[0] == src && adopt_expert_name(c);
        if (c.is_expert) {
            c.expert_stride = src->nb[2];
            c.n_expert = static_cast<int>(src->ne[2]);
        }
        seen_[src] = captured_.size();
        captured_.push_back(std::move(c));
    }
}

bool Seam::adopt_expert_name(CapturedTensor & c) {
    if (parse_expert_name(c.name, recipe_, c.layer, c.projection)) {
        return true;
    }
    static const std::string weight = ".weight";
    if (!starts_with(c.name.c_str(), "blk.") || c.name.size() <= weight.size() ||
        c.name.compare(c.name.size() - weight.size(), weight.size(), weight) != 0) {
        return false;
    }
    const size_t dot = c.name.find('.', 4);
    const size_t end = c.name.size() - weight.size();
    if (dot == std::string::npos || dot >= end) {
        return false;
    }
    recipe_.expert_suffixes.push_back(c.name.substr(dot + 1, end - dot - 1));
    return parse_expert_name(c.name, recipe_, c.layer, c.projection);
}

int Seam::read_ids(ggml_tensor * t) {
    const ggml_tensor * owner = t->view_src != nullptr ? t->view_src : t;
    if (owner->buffer != nullptr && !ggml_backend_buffer_is_host(owner->buffer)) {
        throw Error(std::string(t->name) + " was computed off this process (an RPC worker?): its ids cannot be read");
    }
    const int layer = std::stoi(t->name + std::strlen(kTopkPrefix));
    if (t->type != GGML_TYPE_I32) {
        throw Error(std::string("unexpected type of ") + t->name + ": llama.cpp's MoE graph changed");
    }
    if (dropper_ && mode_ == Mode::Stream) {
        dropped_ += dropper_->apply(t, layer);  // before the ids are read: the router sees what is computed
    }
    ids_.clear();
    const auto * data = static_cast<const char *>(t->data);
    for (int64_t j = 0; j < t->ne[1]; ++j) {
        for (int64_t k = 0; k < t->ne[0]; ++k) {
            ids_.push_back(*reinterpret_cast<const int32_t *>(data + j * t->nb[1] + k * t->nb[0]));
        }
    }
    return layer;
}

bool Seam::on_computed(ggml_tensor * t) {
    if (mode_ == Mode::Capture && warm_up_hint_ && starts_with(t->name, kTopkPrefix)) {
        try {
            const int layer = read_ids(t);
            warm_up_hint_(layer, ids_);
        } catch (...) {  // a hint: the warm-up reads the experts through the mapping either way
        }
        return true;
    }
    if (mode_ != Mode::Stream || !starts_with(t->name, kTopkPrefix) || !streams_layer(t->name)) {
        return true;  // returning false would silently stop the rest of the graph
    }
    try {
        const int layer = read_ids(t);
        router_(layer, ids_, static_cast<int>(t->ne[0]));
        // Only small batches (a decode, a speculative step): a prompt's batch routes to nearly
        // every expert anyway, and its tokens would make a guess as costly as it is useless.
        constexpr int kMaxGuessTokens = 4;
        if (ahead_ != Ahead::None && predictor_ && t->ne[1] <= kMaxGuessTokens && layer + 1 < predicted_layers_ &&
            predictor_->predict(t, layer, guess_, kMaxGuessTokens)) {
            read_ahead_(layer + 1, guess_, ahead_ == Ahead::Read);
        }
        return true;
    } catch (const std::exception & e) {
        error_ = e.what();
        return false;  // stop the graph: nothing may compute on bytes that were not read
    }
}

std::string Seam::take_error() {
    std::string e;
    e.swap(error_);
    return e;
}

void Seam::check_file_layout(const CapturedTensor & c, int fd, uint64_t file_offset) {
    ggml_tensor * t = c.tensor;
    const char * buft = ggml_backend_buft_name(ggml_backend_buffer_get_type(t->buffer));
    // "CPU_Mapped": llama.cpp's file mapping; "CPU": a plain host buffer holding the file's bytes.
    if (!ggml_backend_buffer_is_host(t->buffer) || (std::strcmp(buft, "CPU_Mapped") != 0 && std::strcmp(buft, "CPU") != 0)) {
        throw Error("tensor " + c.name + " lives in buffer type " + buft +
                    ", not llama.cpp's mapped CPU buffer: refusing to stream (llama.cpp repacked it at load: --repack off)");
    }
    unsigned char from_file[64];
    const size_t n = std::min<uint64_t>(sizeof(from_file), c.nbytes);
    if (pread(fd, from_file, n, static_cast<off_t>(file_offset)) != static_cast<ssize_t>(n) ||
        std::memcmp(from_file, t->data, n) != 0) {
        throw Error("tensor " + c.name + " in memory is not the file's bytes (converted or repacked): refusing to stream");
    }
}

void * Seam::data(const CapturedTensor & c) { return c.tensor->data; }

namespace {
std::atomic<bool> g_hook_taken{false};

#ifdef BMOE_HAVE_EXPERT_READY_HOOK
void expert_ready(const ggml_tensor * src0, int expert, void * user_data) {
    static_cast<Streamer *>(user_data)->wait_ready(src0, expert);
}
#endif
}  // namespace

}  // namespace bmoe::detail

bool bmoe::overlap_in_use() { return detail::g_hook_taken.load(); }

namespace bmoe::detail {

ExpertReadyHook::ExpertReadyHook(Streamer & streamer) {
#ifdef BMOE_HAVE_EXPERT_READY_HOOK
    if (g_hook_taken.exchange(true)) {
        throw Error("another engine in this process already uses overlap (the expert-ready hook is process-wide); "
                    "close it first or run this one without overlap");
    }
    ggml_cpu_set_expert_ready_hook(&expert_ready, &streamer);
#else
    (void) streamer;
    throw Error("overlap needs the expert-ready hook (patch 0001), and this build is against stock llama.cpp; "
                "rebuild with the patches (the default: BMOE_LLAMA_PATCHES=ON) or run without --overlap");
#endif
}

ExpertReadyHook::~ExpertReadyHook() {
#ifdef BMOE_HAVE_EXPERT_READY_HOOK
    ggml_cpu_set_expert_ready_hook(nullptr, nullptr);
    g_hook_taken.store(false);
#endif
}

void Seam::repoint(const CapturedTensor & c, void * new_data) { c.tensor->data = new_data; }

}  // namespace bmoe::detail
