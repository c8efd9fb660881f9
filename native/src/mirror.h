// The page-phase mirror of one model file: a private anonymous reservation the size of the file,
// so byte `o` of the file lives at base() + o. Expert tensors are repointed into it once; slices
// are read straight into place. Pages are reference-counted because neighbouring slices (and, in
// dense=anon mode, dense tensors) can share a page: a page is released (MADV_DONTNEED) only when
// nothing resident or in flight still covers it. Only the eval thread calls acquire/release.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace bmoe::detail {

class Mirror {
public:
    Mirror(uint64_t file_size, size_t page_size);
    ~Mirror();
    Mirror(const Mirror &) = delete;
    Mirror & operator=(const Mirror &) = delete;

    uint8_t * base() const { return base_; }
    uint64_t size() const { return size_; }

    // Count [offset, offset+length) as resident (or about to be): its pages stay mapped.
    void acquire(uint64_t offset, uint64_t length);
    // Drop one count; pages nobody covers any more are returned to the kernel.
    void release(uint64_t offset, uint64_t length);
    // Whole pages currently covered by at least one resident range.
    uint64_t resident_bytes() const { return resident_pages_ * page_size_; }

private:
    uint8_t * base_ = nullptr;
    uint64_t size_ = 0;
    size_t page_size_ = 0;
    std::vector<uint32_t> page_refs_;
    uint64_t resident_pages_ = 0;
};

}  // namespace bmoe::detail
