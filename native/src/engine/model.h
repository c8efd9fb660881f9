// The model, in two lifetimes. ModelSource: the gguf file's map, its checks before anything loads, and the
// layers placed on RPC workers; it is opened first and closed last, since the streaming parts are built over
// its map. Model: the llama_model loaded from it and its shape, immutable after the open; freed before the
// streaming parts, whose mirrors its expert tensors point into (docs/engine.md, "the state").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "bmoe/config.h"
#include "bmoe/metrics.h"
#include "bmoe/recipes.h"
#include "llama-cpp.h"
#include "model/gguf_map.h"
#include "policy/rpc_placement.h"
#include "rpc/rpc_workers.h"

namespace bmoe::detail {

class ModelSource {
public:
    // The steps that need only the file, in order: its header, the lossy settings against it, the
    // architectures that cannot stream, the RPC workers probed and the layers placed on them.
    ModelSource(const std::string & path, const StreamConfig & config, RunInfo & info);
    ModelSource(const ModelSource &) = delete;
    ModelSource & operator=(const ModelSource &) = delete;

    GgufMap & gguf() const { return *gguf_; }
    RpcWorkers * rpc() const { return rpc_.get(); }  // null without workers
    const LayerPlacement & placement() const { return placement_; }
    bool has_workers() const { return !rpc_endpoints_.empty(); }

private:
    void check_lossy_settings(const std::string & path, const StreamConfig & config, RunInfo & info) const;
    void refuse_unstreamable(const std::string & path, const StreamConfig & config, const RunInfo & info) const;
    void place_layers_on_workers(const StreamConfig & config, RunInfo & info);

    std::unique_ptr<GgufMap> gguf_;
    std::vector<std::string> rpc_endpoints_;
    std::vector<double> rpc_split_;
    std::unique_ptr<RpcWorkers> rpc_;  // registered before the model loads
    LayerPlacement placement_;
};

class Model {
public:
    // llama.cpp's load (lazily for the experts when `recipe` streams them), then the shape in the run info.
    Model(const std::string & path, const StreamConfig & config, const ModelSource & file, const Recipe * recipe,
          RunInfo & info);
    Model(const Model &) = delete;
    Model & operator=(const Model &) = delete;

    llama_model * get() const { return model_.get(); }
    const llama_vocab * vocab() const { return vocab_; }
    // A recurrent or hybrid trunk: its state is cut back only from llama.cpp's snapshots.
    bool recurrent() const;

private:
    void read_shape(const std::string & path, const StreamConfig & config, RunInfo & info) const;

    llama_model_ptr model_;
    const llama_vocab * vocab_ = nullptr;
};

}  // namespace bmoe::detail
