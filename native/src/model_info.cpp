#include "bmoe/model_info.h"

#include "bmoe/error.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "bmoe/recipes.h"
#include "gguf_map.h"
#include "seam.h"
#include "llama.h"
#include "llama_runtime.h"

namespace bmoe {
namespace {

struct ModelDeleter {
    void operator()(llama_model * model) const { llama_model_free(model); }
};

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
    std::unique_ptr<llama_model, ModelDeleter> model(llama_model_load_from_file(path.c_str(), mparams));
    if (!model) {
        const std::string why = detail::last_llama_error();
        fail(path, "llama.cpp could not load it" + (why.empty() ? std::string() : " (" + why + ")"));
    }
    info.architecture = meta(model.get(), "general.architecture");
    info.name = meta(model.get(), "general.name");
    // vocab_only leaves the hparams unset: read the counts from the metadata.
    info.n_layer = meta_int(model.get(), info.architecture + ".block_count");
    info.n_embd = meta_int(model.get(), info.architecture + ".embedding_length");
    info.n_expert = meta_int(model.get(), info.architecture + ".expert_count");
    info.n_expert_used = meta_int(model.get(), info.architecture + ".expert_used_count");
    info.n_vocab = static_cast<uint64_t>(llama_vocab_n_tokens(llama_model_get_vocab(model.get())));
    if (const Recipe * recipe = find_recipe(info.architecture)) {
        for (const auto & [name, loc] : gguf.tensors()) {
            int layer = 0;
            int projection = 0;
            if (detail::parse_expert_name(name, *recipe, layer, projection)) {
                info.expert_bytes += loc.size;
            }
        }
    }
    return info;
}

}  // namespace bmoe
