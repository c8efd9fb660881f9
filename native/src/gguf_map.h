// Where every tensor of a (possibly split) gguf model lives on disk: file, absolute offset, size.
// Read with the gguf C API (no_alloc: no tensor data touched) and checked against the file sizes
// before anything else happens, so a truncated or lying file is refused up front.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace bmoe::detail {

struct TensorLocation {
    uint32_t file = 0;
    uint64_t offset = 0;  // absolute byte offset of the tensor's data in its file
    uint64_t size = 0;
};

class GgufMap {
public:
    // Throws bmoe::Error: missing file or shard, bad gguf, tensor data past the end of its file.
    explicit GgufMap(const std::string & path);

    const TensorLocation * find(const std::string & name) const;
    const std::vector<std::string> & files() const { return files_; }
    const std::vector<uint64_t> & file_sizes() const { return file_sizes_; }
    const std::string & architecture() const { return architecture_; }
    uint64_t total_bytes() const;
    size_t n_tensors() const { return tensors_.size(); }
    const std::unordered_map<std::string, TensorLocation> & tensors() const { return tensors_; }

private:
    void add_file(const std::string & path, uint32_t index);

    std::vector<std::string> files_;
    std::vector<uint64_t> file_sizes_;
    std::unordered_map<std::string, TensorLocation> tensors_;
    std::string architecture_;
};

}  // namespace bmoe::detail
