// Which tensors of an architecture are the routed experts: one data row per architecture.
#pragma once

#include <string>
#include <vector>

namespace bmoe {

struct Recipe {
    std::string architecture;                 // general.architecture
    std::vector<std::string> expert_suffixes;  // blk.<il>.<suffix>.weight, one per projection
    std::string note;
};

const std::vector<Recipe> & recipes();
const Recipe * find_recipe(const std::string & architecture);

}  // namespace bmoe
