// llama.cpp's repacked CPU kernels (ggml-cpu's repack.cpp: Q4_0, Q4_K, IQ4_NL, ... interleaved for the
// CPU's dot products) for the streamed experts, as stock llama.cpp uses them resident. llama.cpp repacks the
// dense weights itself at load (its CPU_REPACK buffer type); the experts it loads lazily in the file's
// mapping (model.cpp keeps them out of CPU_REPACK), and here each one the pin has a layout for is handed to
// the same kernels: its `buffer` and `extra` become what llama.cpp's loader would have set, and its slices
// are converted into that layout as the lanes read them. The same bytes under the same kernels: streamed
// equals resident with repack on, bit for bit.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "read/slice_layout.h"
#include "seam/seam.h"

struct ggml_backend_buffer;
struct ggml_backend_buffer_type;

namespace bmoe::detail {

class RepackedExperts {
public:
    // Throws bmoe::Error where this build of the CPU backend has no repacked buffer type.
    RepackedExperts();
    ~RepackedExperts();
    RepackedExperts(const RepackedExperts &) = delete;
    RepackedExperts & operator=(const RepackedExperts &) = delete;

    // Hand the expert tensor to the repacked kernels and return the layout its slices must be converted to;
    // nullptr (and nothing changed) where the pin has no layout for its type, shape and this CPU.
    std::shared_ptr<const SliceLayout> attach(const CapturedTensor & c);

    // Each streamed type and its layout ("q4_K: q4_K_8x8, q6_K: file"), of the tensors attach saw.
    std::string layouts() const;

private:
    std::map<std::string, std::string> by_type_;
    ggml_backend_buffer_type * buft_ = nullptr;
    ggml_backend_buffer * stand_in_ = nullptr;  // a small buffer of that type: what the tensors' `buffer` names
    // The layout ggml chose per (type, columns, rows): its name, as its repack logged it.
    std::map<std::tuple<int, int64_t, int64_t>, std::string> names_;
};

}  // namespace bmoe::detail
