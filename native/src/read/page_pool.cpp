#include "read/page_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "bmoe/error.h"

namespace bmoe::detail {
namespace {

#ifndef MADV_COLD
#define MADV_COLD 20  // Linux 5.4; older kernels ignore it (EINVAL) and keep the deferred split
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels get the touch loop below
#endif

// Huge pages up to 32 MiB (2 MiB on a 4 KiB kernel, 32 MiB on a 16 KiB one like the Pi 5's) are the
// pool's growth step; 512 MiB ones (a 64 KiB kernel) would be too coarse for a memory budget, and
// there the pool grows a unit at a time.
constexpr uint64_t kMaxChunkBytes = 32ULL << 20;

uint64_t huge_page_bytes() {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
    uint64_t bytes = 0;
    return f >> bytes ? bytes : 0;
}

}  // namespace

PagePool::PagePool(uint64_t unit_bytes, uint64_t capacity_bytes) : unit_(unit_bytes) {
    const uint64_t huge = huge_page_bytes();
    const uint64_t align = huge > unit_ && huge % unit_ == 0 ? huge : unit_;
    if (align > unit_ && align <= kMaxChunkBytes) {
        huge_units_ = chunk_units_ = align / unit_;
    }
    capacity_units_ = std::max<uint64_t>(1, (capacity_bytes + unit_ - 1) / unit_);
    reserved_bytes_ = capacity_units_ * unit_ + align;
    // MAP_NORESERVE: the reservation is address space; only populated units are memory.
    void * p = mmap(nullptr, reserved_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        throw Error(std::string("cannot reserve the expert page pool (") + std::to_string(reserved_bytes_) +
                    " bytes of address space): " + std::strerror(errno));
    }
    reserved_ = static_cast<uint8_t *>(p);
    base_ = reinterpret_cast<uint8_t *>((reinterpret_cast<uintptr_t>(reserved_) + align - 1) / align * align);
    // Advice: without huge pages the pool works the same, its pages are only scattered.
    madvise(base_, capacity_units_ * unit_, MADV_HUGEPAGE);
    // A forked child (a subprocess) must not share pages a read lane is writing into.
    madvise(base_, capacity_units_ * unit_, MADV_DONTFORK);
    populated_.assign(capacity_units_, 0);
}

PagePool::~PagePool() {
    if (reserved_ != nullptr) {
        munmap(reserved_, reserved_bytes_);
    }
}

void PagePool::set_huge_pages(bool on) {
    chunk_units_ = on ? huge_units_ : 1;
    // With THP "always" even plain growth would get huge pages: say no for the rest of the region.
    const uint64_t rest = capacity_units_ - size_units_;
    if (rest > 0) {
        madvise(address(size_units_), rest * unit_, on ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    }
}

void PagePool::populate(PoolExtent e) {
    uint8_t * at = address(e.first);
    const uint64_t bytes = e.count * unit_;
    if (madvise(at, bytes, MADV_POPULATE_WRITE) != 0) {
        if (errno != EINVAL) {
            throw Error(std::string("cannot allocate ") + std::to_string(bytes >> 10) +
                        " KiB for the expert page pool: " + std::strerror(errno));
        }
        const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
        for (uint64_t off = 0; off < bytes; off += page) {
            static_cast<volatile uint8_t *>(at)[off] = 0;
        }
    }
    mark_populated(e, true);
}

uint64_t PagePool::mark_populated(PoolExtent e, bool present) {
    uint64_t changed = 0;
    for (uint64_t u = e.first; u < e.first + e.count; ++u) {
        if ((populated_[u] != 0) != present) {
            populated_[u] = present ? 1 : 0;
            ++changed;
        }
    }
    populated_count_ = present ? populated_count_ + changed : populated_count_ - changed;
    return changed;
}

bool PagePool::all_populated(PoolExtent e) const {
    const auto first = populated_.begin() + static_cast<long>(e.first);
    return std::find(first, first + static_cast<long>(e.count), 0) == first + static_cast<long>(e.count);
}

void PagePool::grow_by(uint64_t units) {
    // A whole chunk at once: while it is one untouched, aligned range the kernel can back it
    // with one huge page.
    const uint64_t grown = std::min(capacity_units_, (size_units_ + units + chunk_units_ - 1) / chunk_units_ * chunk_units_);
    if (grown < size_units_ + units) {
        throw Error("internal error: the expert page pool is asked for more than the mirrors hold");
    }
    const PoolExtent fresh{size_units_, grown - size_units_};
    populate(fresh);
    // The huge pages are in; now keep khugepaged off these ranges: wherever they are moved, it
    // would only copy them, and fill a slice's neighbouring holes with zeroed memory.
    madvise(address(fresh.first), fresh.count * unit_, MADV_NOHUGEPAGE);
    size_units_ = grown;
    insert_free(fresh);
}

void PagePool::erase_free(std::map<uint64_t, uint64_t>::iterator it) {
    by_size_.erase({it->second, it->first});
    free_units_ -= it->second;
    free_.erase(it);
}

void PagePool::insert_free(PoolExtent e) {
    // Coalesce with the neighbours so large runs stay available for large slices.
    auto next = free_.lower_bound(e.first);
    if (next != free_.end() && e.first + e.count == next->first) {
        e.count += next->second;
        erase_free(next);
    }
    auto prev = free_.lower_bound(e.first);
    if (prev != free_.begin()) {
        --prev;
        if (prev->first + prev->second == e.first) {
            e.first = prev->first;
            e.count += prev->second;
            erase_free(prev);
        }
    }
    free_[e.first] = e.count;
    by_size_.insert({e.count, e.first});
    free_units_ += e.count;
}

std::vector<PoolExtent> PagePool::take(uint64_t units) {
    if (free_units_ < units) {
        grow_by(units - free_units_);
    }
    std::vector<PoolExtent> out;
    in_use_ += units;
    while (units > 0) {
        // Best fit first; otherwise the largest free extent.
        auto fit = by_size_.lower_bound({units, 0});
        if (fit == by_size_.end()) {
            fit = std::prev(by_size_.end());
        }
        const uint64_t first = fit->second;
        const uint64_t count = fit->first;
        erase_free(free_.find(first));
        const uint64_t used = std::min(count, units);
        out.push_back({first, used});
        if (count > used) {
            insert_free({first + used, count - used});
        }
        units -= used;
    }
    for (const PoolExtent & e : out) {
        if (!all_populated(e)) {
            try {
                populate(e);  // trimmed since, or its pages were lost on a failed move back
            } catch (...) {
                for (const PoolExtent & back : out) {
                    give(back);
                }
                throw;
            }
        }
    }
    return out;
}

void PagePool::give(PoolExtent extent, bool pages_back) {
    if (extent.count == 0) {
        return;
    }
    in_use_ -= extent.count;
    if (!pages_back) {
        mark_populated(extent, false);
    }
    insert_free(extent);
}

uint64_t PagePool::trim(uint64_t keep_units) {
    uint64_t dropped = 0;
    for (auto it = free_.rbegin(); it != free_.rend() && populated_count_ > keep_units; ++it) {
        // Only as much of the extent as brings the pool down to keep_units, from its top end.
        const uint64_t excess = populated_count_ - keep_units;
        const uint64_t count = std::min(it->second, excess);
        const uint64_t first = it->first + it->second - count;
        // A free extent is often part of a huge page whose other units hold slices in the mirror.
        // MADV_DONTNEED alone unmaps such pages but frees none of them: the kernel queues the huge page
        // for a deferred split and the cgroup keeps charging all of it (measured: 103-144 MiB under a
        // 1107 MiB cap, which the budget then cannot give the cache). MADV_COLD splits a huge page it
        // covers only in part, so the DONTNEED after it frees exactly the extent's pages.
        if (huge_units_ > 1) {
            madvise(address(first), count * unit_, MADV_COLD);
        }
        if (madvise(address(first), count * unit_, MADV_DONTNEED) == 0) {
            dropped += mark_populated({first, count}, false);
        }
    }
    return dropped;
}

uint64_t PagePool::reserve(uint64_t target_units, uint64_t step_units) {
    target_units = std::min(target_units, capacity_units_);
    // Free units whose pages were trimmed first, then growth (a whole chunk: huge pages).
    for (auto it = free_.begin(); it != free_.end() && populated_count_ < target_units && step_units > 0; ++it) {
        for (uint64_t u = it->first; u < it->first + it->second && populated_count_ < target_units && step_units > 0;) {
            if (populated_[u] != 0) {
                ++u;
                continue;
            }
            uint64_t end = u;
            while (end < it->first + it->second && populated_[end] == 0 &&
                   end - u < std::min(step_units, target_units - populated_count_)) {
                ++end;
            }
            populate({u, end - u});
            step_units -= end - u;
            u = end;
        }
    }
    if (populated_count_ < target_units && step_units > 0 && size_units_ < capacity_units_) {
        grow_by(std::min({step_units, target_units - populated_count_, capacity_units_ - size_units_}));
    }
    return target_units > populated_count_ ? target_units - populated_count_ : 0;
}

}  // namespace bmoe::detail
