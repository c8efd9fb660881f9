// A quick, read-only look at a gguf model: what llama.cpp sees in its metadata, no weights read.
#pragma once

#include <cstdint>
#include <string>

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

}  // namespace bmoe
