#include "read/mirror.h"

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "bmoe/error.h"
#include "read/page_pool.h"

namespace bmoe::detail {
namespace {

constexpr int kReserveFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

std::string map_count_hint() {
    std::ifstream f("/proc/sys/vm/max_map_count");
    long limit = 0;
    return f >> limit ? " (vm.max_map_count is " + std::to_string(limit) +
                            "; a larger page unit or a smaller cache needs fewer mappings)"
                      : "";
}

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4  // Linux 5.7
#endif

// One mremap of [from, from + bytes) to `to` (page-table entries only: no copy, no fault), leaving
// `from` mapped and empty so nothing else can be mapped into it. Returns 0 or an errno.
int move_once(uint8_t * from, uint8_t * to, uint64_t bytes) {
    static std::atomic<bool> dont_unmap{true};  // engines on other threads may move pages too
    if (dont_unmap.load(std::memory_order_relaxed)) {
        if (mremap(from, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, to) != MAP_FAILED) {
            return 0;
        }
        if (errno != EINVAL) {
            return errno;
        }
        dont_unmap.store(false, std::memory_order_relaxed);  // a kernel before 5.7: move, then reserve the hole again
    }
    if (mremap(from, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, to) == MAP_FAILED) {
        return errno;
    }
    mmap(from, bytes, PROT_READ | PROT_WRITE, kReserveFlags | MAP_FIXED, -1, 0);
    return 0;
}

// A range over several mappings (pieces moved in separately; mremap takes one) moves in halves.
int move_pages(uint8_t * from, uint8_t * to, uint64_t bytes, uint64_t unit) {
    const int err = move_once(from, to, bytes);
    if (err != EFAULT || bytes <= unit) {
        return err;
    }
    const uint64_t half = bytes / unit / 2 * unit;
    const int first = move_pages(from, to, half, unit);
    return first != 0 ? first : move_pages(from + half, to + half, bytes - half, unit);
}

}  // namespace

Mirror::Mirror(uint64_t file_size, PagePool & pool) : pool_(pool), unit_(pool.unit()) {
    size_ = (file_size + unit_ - 1) / unit_ * unit_;
    refs_.assign(size_ / unit_, 0);
    slot_.assign(size_ / unit_, 0);
    // MAP_NORESERVE: the reservation is virtual; only pool units mapped into it are memory.
    void * p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, kReserveFlags, -1, 0);
    if (p == MAP_FAILED) {
        throw Error(std::string("cannot reserve the expert mirror (") + std::to_string(size_) +
                    " bytes of address space): " + std::strerror(errno));
    }
    base_ = static_cast<uint8_t *>(p);
}

Mirror::~Mirror() {
    if (base_ != nullptr) {
        munmap(base_, size_);
        // Units still resident go back with the pool itself (it outlives every mirror).
    }
}

void Mirror::map_run(uint64_t first_unit, uint64_t count) {
    const std::vector<PoolExtent> extents = pool_.take(count);
    uint64_t at = first_unit;
    for (size_t i = 0; i < extents.size(); ++i) {
        const PoolExtent & e = extents[i];
        const int err = move_pages(pool_.address(e.first), base_ + at * unit_, e.count * unit_, unit_);
        if (err != 0) {
            // Undo this run: pages already moved here are freed (their units are populated afresh
            // when taken again), the rest of the extents go back to the pool with their pages.
            madvise(base_ + first_unit * unit_, count * unit_, MADV_DONTNEED);
            for (size_t j = 0; j < extents.size(); ++j) {
                pool_.give(extents[j], j > i);
            }
            throw Error(std::string("cannot map expert pages into the mirror: ") + std::strerror(err) +
                        (err == ENOMEM ? map_count_hint() : ""));
        }
        for (uint64_t k = 0; k < e.count; ++k) {
            slot_[at + k] = static_cast<uint32_t>(e.first + k);
        }
        at += e.count;
    }
}

void Mirror::unmap_run(uint64_t first_unit, uint64_t count) {
    // Move the pages home in runs of consecutive slots (usually one per slice). The range here
    // stays mapped and empty, so no stale alias of a unit stays where it may be mapped next.
    uint64_t start = first_unit;
    for (uint64_t u = first_unit + 1; u <= first_unit + count; ++u) {
        if (u == first_unit + count || slot_[u] != slot_[u - 1] + 1) {
            uint8_t * here = base_ + start * unit_;
            const uint64_t bytes = (u - start) * unit_;
            const bool home = move_pages(here, pool_.address(slot_[start]), bytes, unit_) == 0;
            if (!home) {
                madvise(here, bytes, MADV_DONTNEED);  // the units get fresh pages when taken again
            }
            pool_.give({slot_[start], u - start}, home);
            start = u;
        }
    }
}

void Mirror::acquire(uint64_t offset, uint64_t length) {
    if (length == 0) {
        return;
    }
    if (offset > size_ || length > size_ - offset) {
        throw Error("internal error: mirror range past its file");
    }
    const uint64_t first = offset / unit_;
    const uint64_t last = (offset + length - 1) / unit_;
    // Map the runs of units nobody holds yet, then count; a failed mapping changes nothing.
    std::vector<std::pair<uint64_t, uint64_t>> mapped;
    try {
        for (uint64_t u = first; u <= last;) {
            if (refs_[u] != 0) {
                ++u;
                continue;
            }
            uint64_t end = u;
            while (end <= last && refs_[end] == 0) {
                ++end;
            }
            map_run(u, end - u);
            mapped.emplace_back(u, end - u);
            u = end;
        }
    } catch (...) {
        for (const auto & [u, n] : mapped) {
            unmap_run(u, n);
        }
        throw;
    }
    for (uint64_t u = first; u <= last; ++u) {
        if (refs_[u]++ == 0) {
            ++resident_units_;
        }
    }
}

void Mirror::release(uint64_t offset, uint64_t length) {
    if (length == 0) {
        return;
    }
    if (offset > size_ || length > size_ - offset) {
        throw Error("internal error: mirror range past its file");
    }
    const uint64_t first = offset / unit_;
    const uint64_t last = (offset + length - 1) / unit_;
    uint64_t run_start = 0;
    uint64_t run_len = 0;
    auto flush = [&] {
        if (run_len > 0) {
            unmap_run(run_start, run_len);
            run_len = 0;
        }
    };
    for (uint64_t u = first; u <= last; ++u) {
        if (refs_[u] == 0) {
            throw Error("internal error: mirror page released more often than acquired");
        }
        if (--refs_[u] == 0) {
            --resident_units_;
            if (run_len == 0) {
                run_start = u;
            }
            ++run_len;
        } else {
            flush();
        }
    }
    flush();
}

}  // namespace bmoe::detail
