// Which tensors of a model file are expert weights, by name: "blk.<il>.<suffix>.weight" with a
// suffix the architecture's recipe lists. The graph has the last word (the seam adopts a suffix
// the recipe lacks when a MUL_MAT_ID uses it); this is what can be known from the file alone.
#pragma once

#include <string>
#include <vector>

#include "bmoe/recipes.h"
#include "model/gguf_map.h"

namespace bmoe::detail {

// "blk.<il>.<rest>" -> il, or -1 (not a layer's tensor); `rest`, if given, is set to where <rest> starts.
int block_of(const std::string & name, size_t * rest = nullptr);
// "blk.<il>.<suffix>.weight" with suffix from the recipe -> layer and projection index.
bool parse_expert_name(const std::string & name, const Recipe & recipe, int & layer, int & projection);

struct NamedExpertTensor {
    const std::string * name = nullptr;        // owned by the GgufMap
    const TensorLocation * location = nullptr;  // owned by the GgufMap
    int layer = 0;
    int projection = 0;
};

// The file's expert tensors by name, in no particular order; valid while `gguf` lives.
std::vector<NamedExpertTensor> named_expert_tensors(const GgufMap & gguf, const Recipe & recipe);

}  // namespace bmoe::detail
