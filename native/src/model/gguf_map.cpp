#include "model/gguf_map.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "bmoe/error.h"
#include "gguf.h"
#include "llama.h"
#include "model/llama_runtime.h"
#include "model/preload_checks.h"

namespace bmoe::detail {
namespace {

struct GgufDeleter {
    void operator()(gguf_context * ctx) const { gguf_free(ctx); }
};
using GgufPtr = std::unique_ptr<gguf_context, GgufDeleter>;

GgufPtr open_gguf(const std::string & path) {
    clear_llama_error();
    gguf_init_params params{};
    params.no_alloc = true;
    GgufPtr ctx(gguf_init_from_file(path.c_str(), params));
    if (!ctx) {
        const std::string why = last_llama_error();
        throw Error(path + ": invalid or truncated gguf" + (why.empty() ? "" : " (" + why + ")"));
    }
    return ctx;
}

int64_t key_u16_or(const gguf_context * ctx, const std::string & path, const char * key, int64_t fallback) {
    const int64_t id = gguf_find_key(ctx, key);
    if (id < 0) {
        return fallback;
    }
    if (gguf_get_kv_type(ctx, id) != GGUF_TYPE_UINT16) {
        throw Error(path + ": metadata key " + key + " has the wrong type (expected uint16)");
    }
    return static_cast<int64_t>(gguf_get_val_u16(ctx, id));
}

}  // namespace

GgufMap::GgufMap(const std::string & path) {
    GgufPtr first = open_gguf(path);
    const int64_t arch_key = gguf_find_key(first.get(), "general.architecture");
    if (arch_key >= 0 && gguf_get_kv_type(first.get(), arch_key) == GGUF_TYPE_STRING) {
        architecture_ = gguf_get_val_str(first.get(), arch_key);
    }
    const int64_t n_split = key_u16_or(first.get(), path, "split.count", 1);
    if (n_split <= 1) {
        add_file(path, 0);
        return;
    }
    const int64_t split_no = key_u16_or(first.get(), path, "split.no", 0);
    if (split_no != 0) {
        throw Error(path + ": this is shard " + std::to_string(split_no + 1) + " of " + std::to_string(n_split) +
                    "; open the first shard (-00001-of-...) instead");
    }
    char prefix[4096];
    if (llama_split_prefix(prefix, sizeof(prefix), path.c_str(), 0, static_cast<int>(n_split)) <= 0) {
        throw Error(path + ": split model, but the name does not end in -00001-of-" + std::to_string(n_split) +
                    ".gguf");
    }
    for (int64_t i = 0; i < n_split; ++i) {
        char shard[4096];
        llama_split_path(shard, sizeof(shard), prefix, static_cast<int>(i), static_cast<int>(n_split));
        struct stat st {};
        if (stat(shard, &st) != 0) {
            throw Error(std::string(shard) + ": missing shard " + std::to_string(i + 1) + " of " +
                        std::to_string(n_split) + " (all shards must sit beside the first)");
        }
        add_file(shard, static_cast<uint32_t>(i));
    }
}

void GgufMap::add_file(const std::string & path, uint32_t index) {
    auto file = std::make_unique<ModelFile>(path);  // the descriptor every later reader derives from
    GgufPtr ctx = open_gguf(path);
    file->check_same_as_path();  // what was parsed is the file held open
    if (index == 0) {
        check_before_load(ctx.get(), path, architecture_);
    }
    const uint64_t file_size = file->size();
    files_.push_back(path);
    file_sizes_.push_back(file_size);
    model_files_.push_back(std::move(file));
    const uint64_t data_offset = gguf_get_data_offset(ctx.get());
    const int64_t n = gguf_get_n_tensors(ctx.get());
    for (int64_t i = 0; i < n; ++i) {
        TensorLocation loc;
        loc.file = index;
        loc.size = gguf_get_tensor_size(ctx.get(), i);
        loc.n_slices = static_cast<uint64_t>(std::max<int64_t>(1, gguf_get_tensor_ne(ctx.get(), i)[2]));
        const char * name = gguf_get_tensor_name(ctx.get(), i);
        uint64_t end = 0;
        if (__builtin_add_overflow(data_offset, static_cast<uint64_t>(gguf_get_tensor_offset(ctx.get(), i)),
                                   &loc.offset) ||
            __builtin_add_overflow(loc.offset, loc.size, &end) || end > file_size) {
            throw Error(path + ": tensor " + name + " (" + std::to_string(loc.size) + " bytes) lies past the end of the "
                        "file (" + std::to_string(file_size) + " bytes): truncated or corrupt");
        }
        if (!tensors_.emplace(name, loc).second) {
            throw Error(path + ": tensor " + name + " is listed twice: the file is corrupt");
        }
    }
}

void GgufMap::check_unchanged() const {
    for (const auto & f : model_files_) {
        f->check_unchanged();
    }
}

std::string GgufMap::changed() const {
    for (const auto & f : model_files_) {
        std::string why = f->changed();
        if (!why.empty()) {
            return why;
        }
    }
    return "";
}

void GgufMap::check_same_as_paths() const {
    for (const auto & f : model_files_) {
        f->check_same_as_path();
        f->check_unchanged();
    }
}

const TensorLocation * GgufMap::find(const std::string & name) const {
    const auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
}

uint64_t GgufMap::total_bytes() const {
    uint64_t total = 0;
    for (uint64_t s : file_sizes_) {
        total += s;
    }
    return total;
}

}  // namespace bmoe::detail
