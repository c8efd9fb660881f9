#include "bmoe/recipes.h"

namespace bmoe {

namespace {
// Every routed-expert tensor name of the pinned llama.cpp (llama-arch.cpp, LLM_TENSOR_FFN_*_EXPS and
// the chunked *_CHEXPS), in read order: gate, up, [fused gate_up,] down. A model has the subset it has.
const std::vector<std::string> kExpertSuffixes = {
    "ffn_gate_exps", "ffn_up_exps", "ffn_gate_up_exps", "ffn_down_exps",
    "ffn_gate_chexps", "ffn_up_chexps", "ffn_down_chexps",
};
}  // namespace

// Only what differs from the default. Shared experts (ffn_*_shexp) are dense weights: used by every
// token, they stay in memory everywhere.
const std::vector<Recipe> & recipes() {
    static const std::string kEncoder = "an encoder (embeddings, no generation): nothing to stream";
    static const std::vector<Recipe> table = {
        {"bert", kExpertSuffixes, "", kEncoder},
        {"jina-bert-v2", kExpertSuffixes, "", kEncoder},
        {"jina-bert-v3", kExpertSuffixes, "", kEncoder},
        {"nomic-bert", kExpertSuffixes, "", kEncoder},
        {"nomic-bert-moe", kExpertSuffixes, "", kEncoder},
        {"llama-embed", kExpertSuffixes, "", kEncoder},
        // Measured: the graph builds two routings per layer (experts, then chunk experts over a shared
        // router) and both are named ffn_moe_topk-<il>; the stream phase stops on the second one.
        {"grovemoe", kExpertSuffixes, "",
         "two routings per layer (experts and chunk experts) share one ffn_moe_topk name: the seam cannot tell "
         "whose ids it reads"},
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

Recipe recipe_for(const std::string & architecture) {
    if (const Recipe * row = find_recipe(architecture)) {
        return *row;
    }
    return Recipe{architecture, kExpertSuffixes, "", ""};
}

}  // namespace bmoe
