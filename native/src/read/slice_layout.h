// How the bytes of one expert slice, as the file holds them, become what the compute kernels read. With
// llama.cpp's repacked CPU kernels (--repack) a slice is stored interleaved in their layout, which is not the
// file's: a lane reads such a slice into its own scratch buffer, checks it there (verify_slices), and converts
// it into its place in the mirror, so the place never holds anything but the kernels' bytes. Knows nothing of
// llama.cpp: the repacked layouts are implemented by the seam (seam/repacked.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace bmoe::detail {

class SliceLayout {
public:
    explicit SliceLayout(uint64_t slice_bytes) : slice_bytes_(slice_bytes) {}
    virtual ~SliceLayout() = default;
    SliceLayout(const SliceLayout &) = delete;
    SliceLayout & operator=(const SliceLayout &) = delete;

    // One expert's slice: the file's bytes and the converted ones are this long.
    uint64_t slice_bytes() const { return slice_bytes_; }
    // What the run info calls it ("q4_0_8x8"; "file" for the file's own).
    virtual const std::string & name() const = 0;
    // Convert `bytes` (whole slices, one after the other, as the file holds them) into `to`; `from` and `to`
    // do not overlap. Called by several lanes at once.
    virtual void convert(const uint8_t * from, uint8_t * to, uint64_t bytes) const = 0;

private:
    uint64_t slice_bytes_;
};

// The file's own layout, copied: the slices of a tensor without a repacked layout, in a run where others
// have one. A direct read's aligned window writes the edge blocks of its neighbours in the mirror, harmless
// while they hold the file's bytes too, not once a neighbour holds repacked ones: these are read into the
// lane's buffer and only the slice itself is copied into place.
class FileLayout final : public SliceLayout {
public:
    using SliceLayout::SliceLayout;
    const std::string & name() const override {
        static const std::string kName = "file";
        return kName;
    }
    void convert(const uint8_t * from, uint8_t * to, uint64_t bytes) const override { std::memcpy(to, from, bytes); }
};

}  // namespace bmoe::detail
