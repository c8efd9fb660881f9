#include "bmoe/recipes.h"

namespace bmoe {

namespace {
const std::vector<std::string> kSplit = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
// llama.cpp uses a fused gate_up tensor where the file has one and separate gate/up otherwise.
const std::vector<std::string> kSplitOrFused = {"ffn_gate_exps", "ffn_up_exps", "ffn_gate_up_exps", "ffn_down_exps"};
}  // namespace

// A row per architecture whose MoE FFN llama.cpp builds with build_moe_ffn (the ffn_moe_topk node).
// Shared experts (ffn_*_shexp) are dense weights: used by every token, they stay in memory.
const std::vector<Recipe> & recipes() {
    static const std::vector<Recipe> table = {
        {"qwen3moe", kSplit, "Qwen3 MoE (Qwen3-30B-A3B, Qwen3-235B-A22B)"},
        {"qwen2moe", kSplit, "Qwen1.5/2 MoE; shared expert stays dense"},
        {"olmoe", kSplit, "OLMoE"},
        {"llama", kSplit, "Mixtral-style llama with experts"},
        {"gpt-oss", kSplit, "gpt-oss; expert biases stay dense"},
        {"deepseek2", kSplitOrFused, "DeepSeek-V2/V3 style; shared experts stay dense"},
        {"granitemoe", kSplit, "Granite MoE"},
        {"bailingmoe", kSplit, "Ling/Bailing MoE"},
        {"lfm2moe", kSplit, "LFM2 MoE"},
        {"qwen35moe", kSplitOrFused, "Qwen3.5 MoE"},
        {"gemma4", kSplitOrFused, "Gemma 4 MoE: fused gate_up experts (or separate gate/up)"},
    };
    return table;
}

const Recipe * find_recipe(const std::string & architecture) {
    for (const auto & r : recipes()) {
        if (r.architecture == architecture) {
            return &r;
        }
    }
    return nullptr;
}

}  // namespace bmoe
