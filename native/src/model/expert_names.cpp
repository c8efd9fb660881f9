#include "model/expert_names.h"

namespace bmoe::detail {

namespace {
const std::string kBlk = "blk.";
}  // namespace

int block_of(const std::string & name, size_t * rest) {
    if (name.compare(0, kBlk.size(), kBlk) != 0) {
        return -1;
    }
    const size_t dot = name.find('.', kBlk.size());
    if (dot == std::string::npos || dot == kBlk.size()) {
        return -1;
    }
    const std::string digits = name.substr(kBlk.size(), dot - kBlk.size());
    // More digits than a layer count can have would overflow std::stoi: not a layer.
    if (digits.size() > 6 || digits.find_first_not_of("0123456789") != std::string::npos) {
        return -1;
    }
    if (rest != nullptr) {
        *rest = dot + 1;
    }
    return std::stoi(digits);
}

bool parse_expert_name(const std::string & name, const Recipe & recipe, int & layer, int & projection) {
    static const std::string weight = ".weight";
    size_t rest = 0;
    const int il = block_of(name, &rest);
    if (il < 0 || name.size() <= kBlk.size() + weight.size() ||
        name.compare(name.size() - weight.size(), weight.size(), weight) != 0 || rest > name.size() - weight.size()) {
        return false;
    }
    const std::string suffix = name.substr(rest, name.size() - weight.size() - rest);
    for (size_t i = 0; i < recipe.expert_suffixes.size(); ++i) {
        if (recipe.expert_suffixes[i] == suffix) {
            layer = il;
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
