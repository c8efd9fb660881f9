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
    // Measured with a fixture (bmoe_edge/synthetic/arch_rows_refused.py): streamed == resident held in the
    // pinned batch, but decoding the prompt as one 64-token batch or one token at a time moved the logits
    // by up to 3.3 (llada-moe) and 4.0 (rnd1); every causal row: 0.
    static const std::string kDiffusion =
        "a diffusion decoder (bidirectional attention): its logits depend on how the prompt is batched, so "
        "left-to-right generation is undefined for it (llama.cpp samples it with llama-diffusion-cli)";
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
        {"llada-moe", kExpertSuffixes, "", kDiffusion},
        {"rnd1", kExpertSuffixes, "", kDiffusion},
        // Measured: a fixture with phimoe's / lfm2moe's experts under the dense name does not load
        // ("check_tensor_dims: tensor 'blk.0.ffn_down.weight' not found", resp. "ffn_gate").
        {"phi3", kExpertSuffixes, "",
         "the loader is dense-only (no router or expert tensors; Phi MoE files are phimoe): a file with experts "
         "does not load, so there is nothing to stream"},
        {"lfm2", kExpertSuffixes, "",
         "the loader makes every layer dense (LFM2 MoE files are lfm2moe): a file with experts does not load, so "
         "there is nothing to stream"},
        // Measured: a DSpark (DeepSeek-V4 backbone) fixture loads, but without embeddings and head of its own
        // the context fails ("dflash requires ctx_other to be set"); with them it streams bit-exactly, yet
        // decodes over an empty draft cache the target's features were meant to fill.
        // Gemma 4's drafts come from a separate assistant model over its KV cache (src/models/gemma4-assistant.cpp;
        // src/llama-model.cpp maps the assistant's sliding layers to the target's layer n_layer - 2, its full
        // ones to n_layer - 1).
        {"gemma4", kExpertSuffixes, "", "", "gemma4-assistant"},
        {"dflash", kExpertSuffixes, "",
         "a speculative draft (DFlash/DSpark): it decodes over the target model's hidden states and borrows its "
         "embeddings and head, so it cannot generate alone (llama.cpp: \"dflash requires ctx_other\")"},
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
    return Recipe{architecture, kExpertSuffixes, "", "", ""};
}

}  // namespace bmoe
