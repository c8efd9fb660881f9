// Requantize a gguf with llama.cpp's own quantizer (the same code as `llama-quantize`), so fixtures
// can carry K-quants that the Python gguf package cannot produce.
#pragma once

#include <string>

namespace bmoe {

// `ftype` is a llama.cpp file-type name: "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", ...
// Throws bmoe::Error for an unknown type or when llama.cpp fails.
void quantize_model(const std::string & input, const std::string & output, const std::string & ftype,
                    int threads);

}  // namespace bmoe
