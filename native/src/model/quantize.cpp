#include "bmoe/quantize.h"

#include <map>
#include <vector>

#include "bmoe/error.h"
#include "llama.h"
#include "model/llama_runtime.h"

namespace bmoe {
namespace {

// The subset of llama_ftype that makes sense for expert streaming fixtures and benchmarks.
const std::map<std::string, llama_ftype> & ftypes() {
    static const std::map<std::string, llama_ftype> table = {
        {"F32", LLAMA_FTYPE_ALL_F32},          {"F16", LLAMA_FTYPE_MOSTLY_F16},
        {"Q8_0", LLAMA_FTYPE_MOSTLY_Q8_0},     {"Q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},
        {"Q4_1", LLAMA_FTYPE_MOSTLY_Q4_1},     {"Q5_0", LLAMA_FTYPE_MOSTLY_Q5_0},
        {"Q2_K", LLAMA_FTYPE_MOSTLY_Q2_K},     {"Q3_K_M", LLAMA_FTYPE_MOSTLY_Q3_K_M},
        {"Q4_K_S", LLAMA_FTYPE_MOSTLY_Q4_K_S}, {"Q4_K_M", LLAMA_FTYPE_MOSTLY_Q4_K_M},
        {"Q5_K_M", LLAMA_FTYPE_MOSTLY_Q5_K_M}, {"Q6_K", LLAMA_FTYPE_MOSTLY_Q6_K},
        {"IQ4_XS", LLAMA_FTYPE_MOSTLY_IQ4_XS}, {"MXFP4_MOE", LLAMA_FTYPE_MOSTLY_MXFP4_MOE},
        {"MIXED", LLAMA_FTYPE_MOSTLY_Q8_0},
    };
    return table;
}

// Per-tensor types over the ftype's (llama.cpp's regex overrides, what llama-quantize --tensor-type does).
// MIXED is the shape the _M recipes ship: dense weights in one type (Q8_0), routed gate/up in another,
// routed down in a third. gate_up: the fused projection (gemma4) is a gate/up tensor too.
std::vector<llama_model_tensor_override> overrides_for(const std::string & ftype) {
    if (ftype == "MIXED") {
        return {{"ffn_(gate|up|gate_up)_exps", GGML_TYPE_Q4_K}, {"ffn_down_exps", GGML_TYPE_Q6_K},
                {nullptr, GGML_TYPE_COUNT}};
    }
    return {};
}

}  // namespace

void quantize_model(const std::string & input, const std::string & output, const std::string & ftype,
                    int threads) {
    detail::ensure_llama_backend();
    const auto it = ftypes().find(ftype);
    if (it == ftypes().end()) {
        std::string known;
        for (const auto & [name, _] : ftypes()) {
            known += (known.empty() ? "" : ", ") + name;
        }
        throw Error("unknown quantization type " + ftype + " (known: " + known + ")");
    }
    llama_model_quantize_params params = llama_model_quantize_default_params();
    params.nthread = threads;
    params.ftype = it->second;
    const std::vector<llama_model_tensor_override> overrides = overrides_for(ftype);
    params.tt_overrides = overrides.empty() ? nullptr : overrides.data();
    detail::clear_llama_error();
    if (llama_model_quantize(input.c_str(), output.c_str(), &params) != 0) {
        const std::string why = detail::last_llama_error();
        throw Error("quantizing " + input + " to " + ftype + " failed" + (why.empty() ? "" : ": " + why));
    }
}

}  // namespace bmoe
