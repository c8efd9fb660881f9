#include "model/preload_checks.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include "bmoe/error.h"
#include "gguf.h"

namespace bmoe::detail {
namespace {

// llama-hparams.h of the pin.
constexpr uint64_t kMaxLayers = 512;
constexpr uint64_t kMaxExperts = 1024;

[[noreturn]] void corrupt(const std::string & path, const std::string & what) {
    throw Error(path + ": " + what + ": the file is corrupt; fetch or convert it again");
}

// llama-vocab.cpp keeps token -> id beside id -> token and asserts
// `id_to_token.size() == token_to_id.size()`: a token string listed twice aborts. Its rule: an
// empty token is stored as "[EMPTY_<id>]".
void check_vocabulary(const gguf_context * ctx, const std::string & path) {
    const int64_t key = gguf_find_key(ctx, "tokenizer.ggml.tokens");
    if (key < 0 || gguf_get_kv_type(ctx, key) != GGUF_TYPE_ARRAY || gguf_get_arr_type(ctx, key) != GGUF_TYPE_STRING) {
        return;  // llama.cpp reports a missing or mistyped vocabulary itself
    }
    const size_t n = gguf_get_arr_n(ctx, key);
    std::unordered_map<std::string, size_t> seen;
    seen.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        std::string word = gguf_get_arr_str(ctx, key, i);
        if (word.empty()) {
            word = "[EMPTY_" + std::to_string(i) + "]";
        }
        const auto [it, inserted] = seen.emplace(std::move(word), i);
        if (!inserted) {
            std::string shown = it->first.substr(0, 40);
            for (char & c : shown) {
                c = (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
            }
            corrupt(path, "the vocabulary lists token '" + shown + "' twice (ids " + std::to_string(it->second) +
                              " and " + std::to_string(i) + ")");
        }
    }
}

// A uint32 key as llama.cpp reads it (it refuses other types itself, with an error); -1 if absent.
int64_t u32_key(const gguf_context * ctx, const std::string & key) {
    const int64_t id = gguf_find_key(ctx, key.c_str());
    if (id < 0 || gguf_get_kv_type(ctx, id) != GGUF_TYPE_UINT32) {
        return -1;
    }
    return gguf_get_val_u32(ctx, id);
}

// The largest expert_used_count: a uint32, or a per-layer array of them.
int64_t max_used(const gguf_context * ctx, const std::string & key) {
    const int64_t id = gguf_find_key(ctx, key.c_str());
    if (id < 0) {
        return 0;
    }
    if (gguf_get_kv_type(ctx, id) == GGUF_TYPE_UINT32) {
        return gguf_get_val_u32(ctx, id);
    }
    if (gguf_get_kv_type(ctx, id) == GGUF_TYPE_ARRAY &&
        (gguf_get_arr_type(ctx, id) == GGUF_TYPE_UINT32 || gguf_get_arr_type(ctx, id) == GGUF_TYPE_INT32)) {
        const auto * v = static_cast<const uint32_t *>(gguf_get_arr_data(ctx, id));
        const size_t n = std::min<size_t>(gguf_get_arr_n(ctx, id), kMaxLayers);
        int64_t most = 0;
        for (size_t i = 0; i < n; ++i) {
            most = std::max<int64_t>(most, v[i]);
        }
        return most;
    }
    return 0;
}

// llama-model.cpp load_hparams: the block count, next-n layers, expert counts and groups.
void check_hparams(const gguf_context * ctx, const std::string & path, const std::string & arch) {
    if (arch.empty() || arch.rfind("hunyuan", 0) == 0) {
        return;  // hunyuan rewrites its expert counts before the asserts
    }
    const std::string p = arch + ".";
    const int64_t n_layer = u32_key(ctx, p + "block_count");
    if (n_layer == 0 || n_layer > static_cast<int64_t>(kMaxLayers)) {
        corrupt(path, p + "block_count is " + std::to_string(n_layer) + " (1 to " + std::to_string(kMaxLayers) +
                          " allowed)");
    }
    const int64_t nextn = u32_key(ctx, p + "nextn_predict_layers");
    if (n_layer > 0 && nextn > n_layer) {
        corrupt(path, p + "nextn_predict_layers (" + std::to_string(nextn) + ") exceeds the block count");
    }
    const int64_t n_expert = std::max<int64_t>(0, u32_key(ctx, p + "expert_count"));
    const int64_t used = max_used(ctx, p + "expert_used_count");
    const int64_t groups = std::max<int64_t>(0, u32_key(ctx, p + "expert_group_count"));
    const int64_t group_used = std::max<int64_t>(0, u32_key(ctx, p + "expert_group_used_count"));
    if (n_expert > static_cast<int64_t>(kMaxExperts)) {
        corrupt(path, p + "expert_count is " + std::to_string(n_expert) + " (at most " + std::to_string(kMaxExperts) +
                          ")");
    }
    if (used > n_expert || (n_expert > 0 && used == 0)) {
        corrupt(path, p + "expert_used_count (" + std::to_string(used) + ") does not fit expert_count (" +
                          std::to_string(n_expert) + ")");
    }
    if (n_expert > 0 && groups >= n_expert && groups > 0) {
        corrupt(path, p + "expert_group_count (" + std::to_string(groups) + ") must be below expert_count");
    }
    if (n_expert == 0 && groups != 0) {
        corrupt(path, p + "expert_group_count is set for a model without experts");
    }
    if (n_expert > 0 && groups > 1 &&
        (n_expert % groups != 0 || group_used == 0 || group_used >= groups)) {
        corrupt(path, p + "expert_group_count (" + std::to_string(groups) + ") and expert_group_used_count (" +
                          std::to_string(group_used) + ") do not fit expert_count (" + std::to_string(n_expert) + ")");
    }
}

}  // namespace

void check_before_load(const gguf_context * ctx, const std::string & path, const std::string & architecture) {
    check_vocabulary(ctx, path);
    check_hparams(ctx, path, architecture);
}

}  // namespace bmoe::detail
