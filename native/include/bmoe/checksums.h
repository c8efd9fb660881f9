// Checksums of a model's bytes: what `bmoe-edge verify-model` records in the model's sidecar and
// what `verify_slices` checks every streamed slice against (CRC-32C, see native/src/crc32c.h).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace bmoe {

// The CRC-32C of each (offset, length) range of the file, read in order with pread. Throws
// bmoe::Error naming the file for a range past its end, a read error, or a file that changes
// while it is read.
std::vector<uint32_t> file_checksums(const std::string & path, const std::vector<std::pair<uint64_t, uint64_t>> & ranges);

// CRC-32C of a byte string (the sidecar's own tests, and "123456789" -> 0xE3069283).
uint32_t crc32c_bytes(const std::string & bytes);

// Which implementation this CPU uses: "sse4.2", "armv8-crc" or "table".
std::string crc32c_implementation();

// One tensor of a (possibly split) model and where its bytes are. `n_slices` is its expert count
// (ne[2]) when the architecture's recipe names it a routed-expert tensor, else 0 (a dense tensor).
struct ModelTensor {
    std::string name;
    uint32_t file = 0;
    uint64_t offset = 0;
    uint64_t bytes = 0;
    uint32_t n_slices = 0;
};

struct ModelLayout {
    std::vector<std::string> files;    // the shards, first to last
    std::vector<uint64_t> file_sizes;
    std::vector<uint64_t> data_starts; // per file: where its first tensor's bytes begin (the header ends)
    std::vector<ModelTensor> tensors;  // by file, then offset
};

// Read with the engine's own gguf map: bounds-checked, no weights read.
ModelLayout model_layout(const std::string & path);

}  // namespace bmoe
