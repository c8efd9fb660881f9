#include "bmoe/checksums.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "bmoe/error.h"
#include "bmoe/recipes.h"
#include "core/crc32c.h"
#include "model/expert_names.h"
#include "model/gguf_map.h"
#include "read/model_file.h"

namespace bmoe {

std::vector<uint32_t> file_checksums(const std::string & path,
                                     const std::vector<std::pair<uint64_t, uint64_t>> & ranges) {
    const detail::ModelFile file(path);
    posix_fadvise(file.fd(), 0, 0, POSIX_FADV_SEQUENTIAL);
    constexpr size_t kChunk = 4 << 20;
    std::vector<uint8_t> buffer(kChunk);
    std::vector<uint32_t> out;
    out.reserve(ranges.size());
    for (const auto & [offset, length] : ranges) {
        if (offset > file.size() || length > file.size() - offset) {
            throw Error(path + ": range of " + std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                        " lies past the end of the file (" + std::to_string(file.size()) + " bytes)");
        }
        uint32_t crc = 0;
        for (uint64_t done = 0; done < length;) {
            const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, length - done));
            const ssize_t n = pread(file.fd(), buffer.data(), want, static_cast<off_t>(offset + done));
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n <= 0) {
                throw Error(path + ": read at offset " + std::to_string(offset + done) + " failed: " +
                            (n < 0 ? std::strerror(errno) : "unexpected end of file"));
            }
            crc = detail::crc32c(buffer.data(), static_cast<size_t>(n), crc);
            done += static_cast<uint64_t>(n);
        }
        out.push_back(crc);
    }
    file.check_unchanged();  // sums of a file rewritten meanwhile would be sums of nothing
    return out;
}

uint32_t crc32c_bytes(const std::string & bytes) { return detail::crc32c(bytes.data(), bytes.size()); }

std::string crc32c_implementation() { return detail::crc32c_implementation(); }

ModelLayout model_layout(const std::string & path) {
    const detail::GgufMap gguf(path);
    ModelLayout out;
    out.files = gguf.files();
    out.file_sizes = gguf.file_sizes();
    out.data_starts.assign(out.files.size(), 0);
    std::vector<bool> seen(out.files.size(), false);
    const Recipe recipe = recipe_for(gguf.architecture());
    for (const auto & [name, loc] : gguf.tensors()) {
        ModelTensor t{printable(name), loc.file, loc.offset, loc.size, 0};
        int layer = 0;
        int projection = 0;
        if (detail::parse_expert_name(name, recipe, layer, projection) && loc.n_slices > 1 &&
            loc.size % loc.n_slices == 0) {
            t.n_slices = static_cast<uint32_t>(loc.n_slices);
        }
        if (!seen[loc.file] || loc.offset < out.data_starts[loc.file]) {
            out.data_starts[loc.file] = loc.offset;
            seen[loc.file] = true;
        }
        out.tensors.push_back(std::move(t));
    }
    for (size_t i = 0; i < out.files.size(); ++i) {
        if (!seen[i]) {
            out.data_starts[i] = out.file_sizes[i];  // no tensors: all of it is header
        }
    }
    std::sort(out.tensors.begin(), out.tensors.end(), [](const ModelTensor & a, const ModelTensor & b) {
        return a.file != b.file ? a.file < b.file : a.offset < b.offset;
    });
    return out;
}

}  // namespace bmoe
