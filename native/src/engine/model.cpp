#include "engine/model.h"

#include <cstdio>
#include <cstdlib>

#include "bmoe/error.h"
#include "core/telemetry.h"
#include "model/llama_runtime.h"

namespace bmoe::detail {
namespace {

int64_t meta_int(const llama_model * model, const std::string & key) {
    char buf[64];
    return llama_model_meta_val_str(model, key.c_str(), buf, sizeof(buf)) < 0 ? 0 : std::atoll(buf);
}

// The expert tensors' names: all of them (suffixes), or with RPC workers only the layers kept here (the first
// `local_layers`), each in full. llama.cpp maps them lazily (patch 0002), so loading does not read the experts,
// and a lazy tensor lands in this process's plain CPU buffer, whatever device its layer is on and whatever
// repacked buffer type would have been chosen: the experts stay the file's bytes until streaming converts them.
// (llama.cpp's tensor_buft_overrides cannot do it: an override to the CPU buffer type picks its repacked
// buffer type again.)
std::vector<std::string> expert_names(const Recipe & recipe, int local_layers) {
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

// The model's expert count from its tensor table: known before llama.cpp loads (and would assert
// on an expert_used_count override above it).
int64_t experts_in_file(const GgufMap & gguf, const std::string & architecture) {
    const Recipe recipe = recipe_for(architecture);
    for (int il = 0; il < 4096; ++il) {
        for (const std::string & suffix : recipe.expert_suffixes) {
            if (const TensorLocation * t = gguf.find("blk." + std::to_string(il) + "." + suffix + ".weight")) {
                return static_cast<int64_t>(t->n_slices);
            }
        }
    }
    return 0;
}

}  // namespace

ModelSource::ModelSource(const std::string & path, const StreamConfig & config, RunInfo & info)
    : rpc_endpoints_(config.rpc.empty() ? std::vector<std::string>{} : parse_endpoints(config.rpc)),
      rpc_split_(config.rpc_split.empty() ? std::vector<double>{} : parse_weights(config.rpc_split)) {
    gguf_ = std::make_unique<GgufMap>(path);  // header, shards, bounds: before any load
    info.architecture = printable(gguf_->architecture());
    info.n_files = static_cast<int>(gguf_->files().size());
    info.file_bytes = gguf_->total_bytes();
    check_lossy_settings(path, config, info);
    refuse_unstreamable(path, config, info);
    place_layers_on_workers(config, info);
}

// --n-expert-used against the file's expert count, and the run info's `lossy` label.
void ModelSource::check_lossy_settings(const std::string & path, const StreamConfig & config, RunInfo & info) const {
    if (config.n_expert_used != kAuto) {
        const int64_t n_expert = experts_in_file(*gguf_, info.architecture);
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

void ModelSource::refuse_unstreamable(const std::string & path, const StreamConfig & config,
                                    const RunInfo & info) const {
    for (const Recipe & r : recipes()) {  // streamed or not: it has no KV cache of its own
        if (r.draft_model == info.architecture) {
            throw Error(path + ": a '" + info.architecture + "' file is a draft model: it decodes over a '" +
                        r.architecture + "' model's KV cache; give it to that model as --draft-model");
        }
    }
    const Recipe recipe_row = recipe_for(info.architecture);
    if (config.stream && !recipe_row.refused.empty()) {  // said before a byte of weights is loaded
        throw Error(path + ": architecture '" + info.architecture + "' cannot be streamed: " + recipe_row.refused +
                    "; run it with --no-stream (bmoe-edge archs)");
    }
}

// Which whole layers go to which RPC worker (the workers probed and registered first).
void ModelSource::place_layers_on_workers(const StreamConfig & config, RunInfo & info) {
    if (!rpc_endpoints_.empty()) {
        rpc_ = std::make_unique<RpcWorkers>(rpc_endpoints_, static_cast<double>(config.rpc_timeout));  // probed before
        placement_ = rpc_->place(*gguf_, rpc_split_, config.stream);
        info.rpc_workers = static_cast<int>(rpc_endpoints_.size());
        info.main_layers = placement_.main_layers;
        info.placement = describe(placement_, rpc_endpoints_, config.stream);
    }
}

Model::Model(const std::string & path, const StreamConfig & config, const ModelSource & file, const Recipe * recipe,
             RunInfo & info) {
    llama_model_params params = llama_model_default_params();
    params.load_mode = LLAMA_LOAD_MODE_MMAP;
    // llama.cpp's repacked kernels where it would use them; streamed experts, and every expert with
    // --repack dense, are kept out of them at load (lazy, below): the streamer repacks them, or nobody does.
    params.use_extra_bufts = config.repack != Repack::Off;
    params.n_gpu_layers = 0;
    // The model's MTP head, where speculation may use it (never on RPC workers, nor beside --parallel's
    // sequences: drafter.cpp).
    params.load_mtp = (config.speculative == Speculative::Mtp || config.speculative == Speculative::Auto) &&
                      !file.has_workers() && config.parallel == 1;
    std::vector<ggml_backend_dev_t> devices;
    std::vector<float> split;
    if (RpcWorkers * rpc = file.rpc()) {  // llama.cpp's own placement: the first layers here, then each worker's
        devices = rpc->devices();
        split = RpcWorkers::tensor_split(file.placement(), llama_max_devices());
        params.devices = devices.data();
        params.tensor_split = split.data();
        params.split_mode = LLAMA_SPLIT_MODE_LAYER;
        params.n_gpu_layers = RpcWorkers::offloaded_layers(file.placement());
    }
    std::vector<std::string> names;
    std::vector<const char *> name_ptrs;
#ifdef BMOE_HAVE_LAZY_TENSOR_SUFFIXES
    // Streamed, or resident with --repack dense: the experts mapped lazily, in the plain CPU buffer.
    if (recipe != nullptr || (params.use_extra_bufts && config.repack == Repack::Dense)) {
        names = expert_names(recipe != nullptr ? *recipe : recipe_for(info.architecture),
                             file.rpc() ? file.placement().main_layers : -1);
        for (const auto & s : names) {
            name_ptrs.push_back(s.c_str());
        }
        name_ptrs.push_back(nullptr);
        params.lazy_tensor_suffixes = name_ptrs.data();
        info.lazy_load = true;
    }
#else
    if (params.use_extra_bufts && config.repack == Repack::Dense && recipe == nullptr) {
        throw Error("--repack dense needs patch 0002 (lazy expert tensors), and this build is against stock llama.cpp");
    }
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
    const uint64_t read0 = storage_read_bytes();
    const uint64_t faults0 = major_faults();
    const auto t0 = Clock::now();
    clear_llama_error();
    model_.reset(llama_model_load_from_file(path.c_str(), params));
    if (!model_) {
        const std::string why = last_llama_error();
        throw Error(path + ": llama.cpp could not load the model" + (why.empty() ? "" : " (" + why + ")"));
    }
    info.load_ms = ms_since(t0);
    info.load_bytes_read = storage_read_bytes() - read0;
    info.load_major_faults = major_faults() - faults0;
    vocab_ = llama_model_get_vocab(model_.get());
    read_shape(path, config, info);
}

// Layers and experts as llama.cpp loaded them; a dense model has nothing to stream.
void Model::read_shape(const std::string & path, const StreamConfig & config, RunInfo & info) const {
    info.n_layer = llama_model_n_layer(model_.get());
    info.n_expert = static_cast<int>(meta_int(model_.get(), info.architecture + ".expert_count"));
    info.n_expert_used = config.n_expert_used > 0  // the file's count, unless overridden (lossy)
                             ? config.n_expert_used
                             : static_cast<int>(meta_int(model_.get(), info.architecture + ".expert_used_count"));
    if (config.stream && info.n_expert == 0) {
        throw Error(path + ": '" + info.architecture +
                    "' model without experts (dense): nothing to stream; run it with --no-stream");
    }
}

bool Model::recurrent() const { return llama_model_is_recurrent(model_.get()) || llama_model_is_hybrid(model_.get()); }

}  // namespace bmoe::detail
