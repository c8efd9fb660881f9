// Which tensors of an architecture are the routed experts, and which architectures are refused.
//
// The common case needs no row: an expert tensor is a `blk.<il>.<suffix>.weight` that the graph uses
// as src[0] of a MUL_MAT_ID (the seam sees this during the warm-up), and llama.cpp names every such
// tensor with one of kExpertSuffixes. Rows remain only for what differs: a refusal with its reason,
// or a note.
#pragma once

#include <string>
#include <vector>

namespace bmoe {

struct Recipe {
    std::string architecture;                 // general.architecture
    std::vector<std::string> expert_suffixes;  // blk.<il>.<suffix>.weight, one per projection
    std::string note;
    std::string refused;  // non-empty: the experts cannot be streamed, and why (one line)
    // The architecture of a separate draft model that reads this model's KV cache (--draft-model), if
    // the pinned graph has one: its layers attend over the target's last two (sliding, then full).
    std::string draft_model;
};

// The rows that differ from the default (refusals, notes, draft models).
const std::vector<Recipe> & recipes();
// The row of an architecture, or nullptr when it has none.
const Recipe * find_recipe(const std::string & architecture);
// The architecture's row, else the default recipe: every expert tensor name llama.cpp uses.
Recipe recipe_for(const std::string & architecture);

}  // namespace bmoe
