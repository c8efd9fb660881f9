// Physical pages for the mirrors, recycled: one memfd whose units are mapped at a slice's mirror
// address when the slice is admitted and handed back when it is evicted. A unit that comes back
// keeps its page (it is neither freed nor zeroed), so the next read into it neither allocates nor
// faults in fresh memory: releasing pages with MADV_DONTNEED and faulting them in again cost more
// than half of the CPU of a cache-off run (docs/bench-data/2026-11-29). Pure mechanism: which
// units back which mirror range is the mirror's business. Used from the eval thread only.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace bmoe::detail {

struct PoolExtent {
    uint64_t first = 0;  // in units
    uint64_t count = 0;
};

class PagePool {
public:
    // `unit_bytes`: the engine's page unit, a multiple of the kernel's page size.
    explicit PagePool(uint64_t unit_bytes);
    ~PagePool();
    PagePool(const PagePool &) = delete;
    PagePool & operator=(const PagePool &) = delete;

    uint64_t unit() const { return unit_; }
    int fd() const { return fd_; }

    // `units` units, in as few extents as the free list allows (each extent is one mmap). Free
    // units are reused before the pool grows, so the pool's size is the peak of units in use.
    std::vector<PoolExtent> take(uint64_t units);
    void give(PoolExtent extent);
    // Return the pages of every free unit to the kernel (memory pressure); they stay usable.
    uint64_t trim();

    uint64_t units_in_use() const { return in_use_; }
    uint64_t size_units() const { return size_units_; }
    // Units whose pages the pool holds at most: in use, or free and kept for reuse since the last
    // trim (the peak of units in use since then).
    uint64_t held_units() const { return held_; }

private:
    void grow_to(uint64_t units);
    void insert_free(PoolExtent extent);
    void erase_free(std::map<uint64_t, uint64_t>::iterator it);

    uint64_t unit_;
    int fd_ = -1;
    uint64_t size_units_ = 0;
    uint64_t in_use_ = 0;
    uint64_t held_ = 0;
    std::map<uint64_t, uint64_t> free_;      // first -> count, coalesced
    std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (count, first)
};

}  // namespace bmoe::detail
