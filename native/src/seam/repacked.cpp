#include "seam/repacked.h"

#include <cstring>
#include <vector>

#include "bmoe/error.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "model/llama_runtime.h"

namespace bmoe::detail {
namespace {

// A one-expert view of an expert tensor (its rows, one expert's slice), as the repack buffer type converts it.
ggml_tensor one_expert_of(const ggml_tensor & t) {
    ggml_tensor one = t;
    one.ne[2] = 1;
    one.ne[3] = 1;
    one.view_src = nullptr;
    one.data = nullptr;
    return one;
}

// One expert of a repacked expert tensor: converting a slice is llama.cpp's own set_tensor of the repack
// buffer type on a one-expert view (its rows interleave in groups of 4 or 8, never across experts: the
// layouts need the rows to divide by the group). The view is copied for each slice, so lanes convert at once.
class RepackedLayout final : public SliceLayout {
public:
    RepackedLayout(const ggml_tensor & expert_tensor, std::string name)
        : SliceLayout(expert_tensor.nb[2]), one_expert_(one_expert_of(expert_tensor)), name_(std::move(name)) {}
    const std::string & name() const override { return name_; }
    void convert(const uint8_t * from, uint8_t * to, uint64_t bytes) const override {
        for (uint64_t at = 0; at < bytes; at += slice_bytes()) {
            ggml_tensor slice = one_expert_;
            slice.data = to + at;
            ggml_backend_tensor_set(&slice, from + at, 0, slice_bytes());
        }
    }

private:
    ggml_tensor one_expert_;
    std::string name_;
};

ggml_backend_buffer_type_t repacked_buffer_type() {
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_reg_t reg = cpu != nullptr ? ggml_backend_dev_backend_reg(cpu) : nullptr;
    auto extra_bufts = reg != nullptr ? reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
                                            ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts"))
                                      : nullptr;
    for (ggml_backend_buffer_type_t * b = extra_bufts != nullptr ? extra_bufts(cpu) : nullptr; b != nullptr && *b != nullptr;
         ++b) {
        if (std::strcmp(ggml_backend_buft_name(*b), Seam::kRepackedBufferType) == 0) {
            return *b;
        }
    }
    return nullptr;
}

// The layout ggml's repack logs for the tensor's type and shape, from one conversion of a zero slice.
std::string layout_name(ggml_tensor one_expert) {
    std::vector<uint8_t> from(ggml_nbytes(&one_expert), 0);
    std::vector<uint8_t> to(from.size());
    one_expert.data = to.data();
    LogCapture log;
    ggml_backend_tensor_set(&one_expert, from.data(), 0, from.size());
    const std::string & text = log.text();
    const size_t with = text.find(" with ");
    if (with == std::string::npos) {
        return std::string(ggml_type_name(one_expert.type)) + "_repacked";  // the pin stopped saying which
    }
    const size_t end = text.find_first_of(" \n", with + 6);
    return text.substr(with + 6, end == std::string::npos ? std::string::npos : end - with - 6);
}

}  // namespace

RepackedExperts::RepackedExperts() : buft_(repacked_buffer_type()) {
    if (buft_ == nullptr) {
        throw Error("this build's CPU backend has no repacked kernels (" + std::string(Seam::kRepackedBufferType) +
                    "); run with --repack off");
    }
    stand_in_ = ggml_backend_buft_alloc_buffer(buft_, ggml_backend_buft_get_alignment(buft_));
    if (stand_in_ == nullptr) {
        throw Error("could not allocate a repacked buffer");
    }
    ggml_backend_buffer_set_usage(stand_in_, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);  // the scheduler's weights
}

RepackedExperts::~RepackedExperts() { ggml_backend_buffer_free(stand_in_); }

std::shared_ptr<const SliceLayout> RepackedExperts::attach(const CapturedTensor & c) {
    ggml_tensor * t = c.tensor;
    ggml_tensor probe = *t;  // what the repack buffer type makes of this tensor, without touching it yet
    probe.buffer = stand_in_;
    probe.extra = nullptr;
    if (ggml_n_dims(t) != 3 || ggml_backend_buffer_init_tensor(stand_in_, &probe) != GGML_STATUS_SUCCESS ||
        probe.extra == nullptr) {
        by_type_.emplace(ggml_type_name(t->type), "file");
        return nullptr;  // no layout here: the plain kernels read the file's bytes
    }
    const auto key = std::make_tuple(static_cast<int>(t->type), t->ne[0], t->ne[1]);
    auto named = names_.find(key);
    if (named == names_.end()) {
        named = names_.emplace(key, layout_name(one_expert_of(probe))).first;
    }
    by_type_[ggml_type_name(t->type)] = named->second;
    t->buffer = stand_in_;  // from now on ggml-cpu computes this tensor with the repacked kernels
    t->extra = probe.extra;
    return std::make_shared<RepackedLayout>(probe, named->second);
}

std::string RepackedExperts::layouts() const {
    std::string out;
    for (const auto & [type, layout] : by_type_) {
        out += (out.empty() ? "" : ", ") + type + ": " + layout;
    }
    return out;
}

}  // namespace bmoe::detail
