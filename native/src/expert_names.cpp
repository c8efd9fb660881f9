#include "expert_names.h"

namespace bmoe::detail {

bool parse_expert_name(const std::string & name, const Recipe & recipe, int & layer, int & projection) {
    static const std::string blk = "blk.";
    static const std::string weight = ".weight";
    if (name.compare(0, blk.size(), blk) != 0 || name.size() <= blk.size() + weight.size() ||
        name.compare(name.size() - weight.size(), weight.size(), weight) != 0) {
        return false;
    }
    const size_t dot = name.find('.', blk.size());
    if (dot == std::string::npos || dot == blk.size()) {
        return false;
    }
    const std::string digits = name.substr(blk.size(), dot - blk.size());
    // More digits than a layer count can have would overflow std::stoi: not a layer.
    if (digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string::npos) {
        return false;
    }
    const std::string suffix = name.substr(dot + 1, name.size() - weight.size() - dot - 1);
    for (size_t i = 0; i < recipe.expert_suffixes.size(); ++i) {
        if (recipe.expert_suffixes[i] == suffix) {
            layer = std::stoi(digits);
            projection = static_cast<int>(i);
            return true;
        }
    }
    return false;
}

std::vector<NamedExpertTensor> named_expert_tensors(const GgufMap & gguf, const Recipe & recipe) {
    std::vector<NamedExpertTensor> out;
    for (const auto & [name, loc] : gguf.tensors()) {
        NamedExpertTensor t;
        if (parse_expert_name(name, recipe, t.layer, t.projection)) {
            t.name = &name;
            t.location = &loc;
            out.push_back(t);
        }
    }
    return out;
}

}  // namespace bmoe::detail
