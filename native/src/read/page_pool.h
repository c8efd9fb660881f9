// Physical pages for the mirrors, recycled: one anonymous region whose units' pages are moved
// (mremap, page-table entries only) to a slice's mirror address when the slice is admitted and
// moved back when it is evicted. A unit that comes back keeps its page (it is neither freed nor
// zeroed), so the next read into it neither allocates nor faults in fresh memory: releasing pages
// with MADV_DONTNEED and faulting them in again cost more than half of the CPU of a cache-off run
// (bench-data/2026-11-29). The region grows in transparent-huge-page sized chunks, populated
// at once, so a slice's pages are physically contiguous where the kernel has huge pages: an
// O_DIRECT read is then a few DMA segments, not one per 4 KiB page (a virtualized disk pays per
// segment: bench-data/2026-12-01/contiguity). Pure mechanism: which units back which mirror
// range is the mirror's business. Used from the eval thread only.
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
    // `unit_bytes`: the engine's page unit, a multiple of the kernel's page size. `capacity_bytes`:
    // the most the mirrors can ever hold (their sizes); only address space is reserved for it.
    PagePool(uint64_t unit_bytes, uint64_t capacity_bytes);
    ~PagePool();
    PagePool(const PagePool &) = delete;
    PagePool & operator=(const PagePool &) = delete;

    uint64_t unit() const { return unit_; }
    // Grow in huge pages (the default, where the kernel has them) or a unit at a time. Takes effect
    // for growth from now on; pages already in the pool stay as they are.
    void set_huge_pages(bool on);

    // `units` units, in as few extents as the free list allows (each extent is one move), their
    // pages present and writable at address(first). Free units are reused before the pool grows.
    std::vector<PoolExtent> take(uint64_t units);
    uint8_t * address(uint64_t unit) const { return base_ + unit * unit_; }
    // The extent's pages are back at address(first) (`pages_back`), or lost (the move back failed:
    // they are populated afresh when the units are taken again).
    void give(PoolExtent extent, bool pages_back = true);
    // Return free units' pages to the kernel (memory pressure) until the pool holds at most
    // `keep_units` (0: every free unit's), the highest addresses first; the units stay usable.
    // Returns how many units gave their pages back.
    uint64_t trim(uint64_t keep_units = 0);
    // Populate free units (growing the pool where it must) until it holds `target_units`, at most
    // `step_units` of them in this call: the memory the cache is going to fill, faulted in while the
    // engine is idle rather than during a prompt. Returns how many units are still to populate.
    uint64_t reserve(uint64_t target_units, uint64_t step_units);

    uint64_t units_in_use() const { return in_use_; }
    uint64_t size_units() const { return size_units_; }
    // Units whose pages the pool holds: in use, or free and kept for reuse since the last trim.
    uint64_t held_units() const { return populated_count_; }

private:
    void grow_by(uint64_t units);
    void populate(PoolExtent extent);
    // Record the extent's pages as present or gone; returns how many units changed.
    uint64_t mark_populated(PoolExtent extent, bool present);
    bool all_populated(PoolExtent extent) const;
    void insert_free(PoolExtent extent);
    void erase_free(std::map<uint64_t, uint64_t>::iterator it);

    uint64_t unit_;
    uint64_t huge_units_ = 1;   // one huge page in units, or 1 where the kernel has none to give
    uint64_t chunk_units_ = 1;  // growth step: huge_units_, or 1 with huge pages off
    uint8_t * reserved_ = nullptr;
    uint64_t reserved_bytes_ = 0;
    uint8_t * base_ = nullptr;  // reserved_, aligned to the huge page size
    uint64_t capacity_units_ = 0;
    uint64_t size_units_ = 0;
    uint64_t in_use_ = 0;
    uint64_t free_units_ = 0;
    std::vector<uint8_t> populated_;  // per unit: its pages are present at address(unit)
    uint64_t populated_count_ = 0;
    std::map<uint64_t, uint64_t> free_;      // first -> count, coalesced
    std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (count, first)
};

}  // namespace bmoe::detail
