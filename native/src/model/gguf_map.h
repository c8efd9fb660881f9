// Where every tensor of a (possibly split) gguf model lives on disk: file, absolute offset, size.
// Read with the gguf C API (no_alloc: no tensor data touched) and checked against the file sizes
// before anything else happens, so a truncated or lying file is refused up front. Each file is
// opened once here (ModelFile: the descriptor and the identity it had) and kept open; what
// llama.cpp would abort on in the metadata it loads is refused here too, before any load
// (preload_checks.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "read/model_file.h"

namespace bmoe::detail {

struct TensorLocation {
    uint32_t file = 0;
    uint64_t offset = 0;  // absolute byte offset of the tensor's data in its file
    uint64_t size = 0;
    uint64_t n_slices = 1;  // ne[2]: the expert count of an expert tensor
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
    const ModelFile & file(size_t index) const { return *model_files_[index]; }
    // Throws bmoe::Error naming the file when any file changed size or mtime since it was opened.
    void check_unchanged() const;
    // Empty, or the first file's change (see ModelFile::changed).
    std::string changed() const;
    // Throws when a path no longer names the file opened (replaced while the model was opening).
    void check_same_as_paths() const;
    size_t n_tensors() const { return tensors_.size(); }
    const std::unordered_map<std::string, TensorLocation> & tensors() const { return tensors_; }

private:
    void add_file(const std::string & path, uint32_t index);

    std::vector<std::unique_ptr<ModelFile>> model_files_;
    std::vector<std::string> files_;
    std::vector<uint64_t> file_sizes_;
    std::unordered_map<std::string, TensorLocation> tensors_;
    std::string architecture_;
};

}  // namespace bmoe::detail
