// The page-phase mirror of one model file: a private anonymous reservation the size of the file,
// so byte `o` of the file lives at base() + o. Expert tensors are repointed into it once; slices
// are read straight into place. Memory comes from the page pool: a range that becomes resident
// gets pool units mapped under it, a range nobody covers any more gives them back (and the
// reservation is restored). Units are reference-counted because neighbouring slices (and, in
// dense=anon mode, dense tensors) can share one: a unit is given back only when nothing resident
// or in flight still covers it. The unit is the engine's page unit, which may be larger than the
// kernel's page (boards run 4, 16 or 64 KiB kernels). Only the eval thread calls acquire/release.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace bmoe::detail {

class PagePool;

class Mirror {
public:
    Mirror(uint64_t file_size, PagePool & pool);
    ~Mirror();
    Mirror(const Mirror &) = delete;
    Mirror & operator=(const Mirror &) = delete;

    uint8_t * base() const { return base_; }
    uint64_t size() const { return size_; }
    uint64_t unit() const { return unit_; }

    // Count [offset, offset+length) as resident (or about to be): units that were not get pool
    // pages mapped under them. Throws bmoe::Error (and changes nothing) if a mapping fails.
    void acquire(uint64_t offset, uint64_t length);
    // Drop one count; units nobody covers any more go back to the pool.
    void release(uint64_t offset, uint64_t length);
    // Whole units currently covered by at least one resident range.
    uint64_t resident_bytes() const { return resident_units_ * unit_; }
    // Test hook: the count of the unit holding `offset`.
    uint32_t references(uint64_t offset) const { return offset / unit_ < refs_.size() ? refs_[offset / unit_] : 0; }

private:
    void map_run(uint64_t first_unit, uint64_t count);
    void unmap_run(uint64_t first_unit, uint64_t count);

    PagePool & pool_;
    uint8_t * base_ = nullptr;
    uint64_t size_ = 0;   // the reservation: the file's size rounded up to whole units
    uint64_t unit_ = 0;
    std::vector<uint32_t> refs_;
    std::vector<uint32_t> slot_;  // pool unit backing each mirror unit while it is resident
    uint64_t resident_units_ = 0;
};

}  // namespace bmoe::detail
