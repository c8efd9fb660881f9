// A quick, read-only look at a gguf model: what llama.cpp sees in its metadata, no weights read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bmoe {

struct ModelInfo {
    std::string path;
    std::string architecture;  // general.architecture
    std::string name;          // general.name, may be empty
    int32_t n_layer = 0;
    int32_t n_embd = 0;
    int32_t n_expert = 0;       // 0 for a dense model
    int32_t n_expert_used = 0;
    int64_t n_tensors = 0;
    uint64_t file_bytes = 0;
    uint64_t n_vocab = 0;
    uint64_t expert_bytes = 0;  // routed-expert tensors per the recipe table (0: unknown arch or dense)
};

// Throws bmoe::Error with a one-line message when the file is missing, not a gguf, or
// llama.cpp refuses it.
ModelInfo probe_model(const std::string & path);

// One routed-expert tensor (per the recipe table) and where its bytes are: what the engine streams.
struct ExpertTensor {
    std::string name;
    int32_t layer = 0;
    int32_t projection = 0;  // index of its suffix in the recipe row (gate, up, [gate_up,] down)
    uint32_t file = 0;       // shard index (0 for a single file)
    uint64_t offset = 0;     // absolute offset of expert 0's bytes in that file
    uint64_t bytes = 0;      // all experts of the tensor
};

// The expert tensors of a (possibly split) model, by layer then projection, read with the engine's
// own gguf map (bounds-checked; no weights read). Empty for a dense model or an unknown architecture.
std::vector<ExpertTensor> expert_tensors(const std::string & path);

// One scalar metadata key of a gguf (arrays are left out): its text, and its value when numeric.
struct MetadataEntry {
    std::string key;
    std::string text;
    double number = 0.0;
    bool is_number = false;
};

// The scalar metadata of a gguf file (its first shard), in file order.
std::vector<MetadataEntry> model_metadata(const std::string & path);

}  // namespace bmoe
