#include "bmoe/model_info.h"

#include "bmoe/error.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <memory>

#include "bmoe/recipes.h"
#include "model/expert_names.h"
#include "gguf.h"
#include "model/gguf_map.h"
#include "llama-cpp.h"  // llama.h, and its owning pointers
#include "model/llama_runtime.h"

namespace bmoe {
namespace {

[[noreturn]] void fail(const std::string & path, const std::string & what) {
    throw Error(path + ": " + what);
}

uint64_t file_size_or_fail(const std::string & path) {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) {
        fail(path, std::strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        fail(path, "not a regular file");
    }
    return static_cast<uint64_t>(st.st_size);
}

void check_magic(const std::string & path) {
    std::unique_ptr<FILE, int (*)(FILE *)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
    char magic[4] = {};
    if (!f || std::fread(magic, 1, 4, f.get()) != 4 || std::memcmp(magic, "GGUF", 4) != 0) {
        fail(path, "not a gguf file (no GGUF magic at the start)");
    }
}

std::string meta(const llama_model * model, const std::string & key) {
    char buf[256];
    const int32_t n = llama_model_meta_val_str(model, key.c_str(), buf, sizeof(buf));
    return n < 0 ? std::string() : std::string(buf);
}

int32_t meta_int(const llama_model * model, const std::string & key) {
    const std::string value = meta(model, key);
    return value.empty() ? 0 : static_cast<int32_t>(std::stol(value));
}

}  // namespace

ModelInfo probe_model(const std::string & path) {
    detail::ensure_llama_backend();
    ModelInfo info;
    info.path = path;
    file_size_or_fail(path);
    check_magic(path);

    const detail::GgufMap gguf(path);  // header, shards and tensor bounds
    info.n_tensors = static_cast<int64_t>(gguf.n_tensors());
    info.file_bytes = gguf.total_bytes();

    // vocab_only: llama.cpp validates the architecture and reads hparams and vocab, no weights.
    llama_model_params mparams = llama_model_default_params();
    mparams.vocab_only = true;
    mparams.n_gpu_layers = 0;
    detail::clear_llama_error();
    llama_model_ptr model(llama_model_load_from_file(path.c_str(), mparams));
    if (!model) {
        const std::string why = detail::last_llama_error();
        fail(path, "llama.cpp could not load it" + (why.empty() ? std::string() : " (" + why + ")"));
    }
    info.architecture = printable(meta(model.get(), "general.architecture"));
    info.name = printable(meta(model.get(), "general.name"));
    // vocab_only leaves the hparams unset: read the counts from the metadata.
    info.n_layer = meta_int(model.get(), info.architecture + ".block_count");
    info.n_embd = meta_int(model.get(), info.architecture + ".embedding_length");
    info.n_expert = meta_int(model.get(), info.architecture + ".expert_count");
    info.n_expert_used = meta_int(model.get(), info.architecture + ".expert_used_count");
    info.n_vocab = static_cast<uint64_t>(llama_vocab_n_tokens(llama_model_get_vocab(model.get())));
    const Recipe recipe = recipe_for(info.architecture);
    for (const auto & t : detail::named_expert_tensors(gguf, recipe)) {
        info.expert_bytes += t.location->size;
    }
    return info;
}

std::vector<ExpertTensor> expert_tensors(const std::string & path) {
    file_size_or_fail(path);
    check_magic(path);
    const detail::GgufMap gguf(path);
    std::vector<ExpertTensor> out;
    const Recipe recipe = recipe_for(gguf.architecture());
    for (const auto & named : detail::named_expert_tensors(gguf, recipe)) {
        ExpertTensor t;
        t.name = printable(*named.name);
        t.layer = named.layer;
        t.projection = named.projection;
        t.file = named.location->file;
        t.offset = named.location->offset;
        t.bytes = named.location->size;
        out.push_back(t);
    }
    std::sort(out.begin(), out.end(), [](const ExpertTensor & a, const ExpertTensor & b) {
        return a.layer != b.layer ? a.layer < b.layer : a.projection < b.projection;
    });
    return out;
}

std::vector<MetadataEntry> model_metadata(const std::string & path) {
    file_size_or_fail(path);
    check_magic(path);
    gguf_init_params params{};
    params.no_alloc = true;
    std::unique_ptr<gguf_context, void (*)(gguf_context *)> ctx(gguf_init_from_file(path.c_str(), params), &gguf_free);
    if (!ctx) {
        fail(path, "invalid or truncated gguf");
    }
    std::vector<MetadataEntry> out;
    const int64_t n = gguf_get_n_kv(ctx.get());
    for (int64_t i = 0; i < n; ++i) {
        MetadataEntry e;
        e.key = printable(gguf_get_key(ctx.get(), i));
        e.is_number = true;
        switch (gguf_get_kv_type(ctx.get(), i)) {
            case GGUF_TYPE_UINT8: e.number = gguf_get_val_u8(ctx.get(), i); break;
            case GGUF_TYPE_INT8: e.number = gguf_get_val_i8(ctx.get(), i); break;
            case GGUF_TYPE_UINT16: e.number = gguf_get_val_u16(ctx.get(), i); break;
            case GGUF_TYPE_INT16: e.number = gguf_get_val_i16(ctx.get(), i); break;
            case GGUF_TYPE_UINT32: e.number = gguf_get_val_u32(ctx.get(), i); break;
            case GGUF_TYPE_INT32: e.number = gguf_get_val_i32(ctx.get(), i); break;
            case GGUF_TYPE_UINT64: e.number = static_cast<double>(gguf_get_val_u64(ctx.get(), i)); break;
            case GGUF_TYPE_INT64: e.number = static_cast<double>(gguf_get_val_i64(ctx.get(), i)); break;
            case GGUF_TYPE_FLOAT32: e.number = gguf_get_val_f32(ctx.get(), i); break;
            case GGUF_TYPE_FLOAT64: e.number = gguf_get_val_f64(ctx.get(), i); break;
            case GGUF_TYPE_BOOL: e.number = gguf_get_val_bool(ctx.get(), i) ? 1.0 : 0.0; break;
            case GGUF_TYPE_STRING:
                e.is_number = false;
                e.text = printable(gguf_get_val_str(ctx.get(), i));
                break;
            default:
                continue;  // arrays (the vocabulary): not scalar metadata
        }
        if (e.is_number) {
            char buf[64];
            std::snprintf(buf, sizeof(buf), "%.17g", e.number);
            e.text = buf;
        }
        out.push_back(e);
    }
    return out;
}

}  // namespace bmoe
