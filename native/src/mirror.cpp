#include "mirror.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "bmoe/error.h"
#include "page_pool.h"

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
        void * want = base_ + at * unit_;
        // MAP_POPULATE installs the page-table entries here, in batches (fault-around), writable (a
        // shared memfd mapping needs no write notification), so the O_DIRECT read that follows
        // finds them instead of faulting once per page: a third less system time per byte read.
        void * got = mmap(want, e.count * unit_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_POPULATE,
                          pool_.fd(), static_cast<off_t>(e.first * unit_));
        if (got == MAP_FAILED) {
            const int err = errno;
            // Undo this run: what was mapped goes back to being reservation, every extent to the pool.
            if (at > first_unit) {
                mmap(base_ + first_unit * unit_, (at - first_unit) * unit_, PROT_READ | PROT_WRITE,
                     kReserveFlags | MAP_FIXED, -1, 0);
            }
            for (const PoolExtent & back : extents) {
                pool_.give(back);
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
    // Give the pool units back in runs of consecutive slots (usually one per slice).
    uint64_t start = first_unit;
    for (uint64_t u = first_unit + 1; u <= first_unit + count; ++u) {
        if (u == first_unit + count || slot_[u] != slot_[u - 1] + 1) {
            pool_.give({slot_[start], u - start});
            start = u;
        }
    }
    // Back to plain reservation: the units may be mapped elsewhere next, and no stale alias of
    // them may stay here. (A failure leaves an alias nobody reads; it is replaced on next use.)
    mmap(base_ + first_unit * unit_, count * unit_, PROT_READ | PROT_WRITE, kReserveFlags | MAP_FIXED, -1, 0);
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
