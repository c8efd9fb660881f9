#include "page_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <string>

#include "bmoe/error.h"

namespace bmoe::detail {

PagePool::PagePool(uint64_t unit_bytes) : unit_(unit_bytes) {
    fd_ = memfd_create("bmoe-expert-pages", MFD_CLOEXEC);
    if (fd_ < 0) {
        throw Error(std::string("cannot create the expert page pool (memfd_create): ") + std::strerror(errno));
    }
}

PagePool::~PagePool() {
    if (fd_ >= 0) {
        close(fd_);
    }
}

void PagePool::grow_to(uint64_t units) {
    // Growing the file allocates nothing: a unit's page appears when it is first written.
    if (ftruncate(fd_, static_cast<off_t>(units * unit_)) != 0) {
        throw Error(std::string("cannot grow the expert page pool to ") + std::to_string((units * unit_) >> 20) +
                    " MiB: " + std::strerror(errno));
    }
    size_units_ = units;
}

void PagePool::erase_free(std::map<uint64_t, uint64_t>::iterator it) {
    by_size_.erase({it->second, it->first});
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
}

std::vector<PoolExtent> PagePool::take(uint64_t units) {
    std::vector<PoolExtent> out;
    in_use_ += units;
    held_ = std::max(held_, in_use_);
    while (units > 0) {
        // Best fit first; otherwise the largest free extent; otherwise grow.
        auto fit = by_size_.lower_bound({units, 0});
        if (fit == by_size_.end() && !by_size_.empty()) {
            fit = std::prev(by_size_.end());
        }
        if (fit == by_size_.end()) {
            out.push_back({size_units_, units});
            grow_to(size_units_ + units);
            return out;
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
    return out;
}

void PagePool::give(PoolExtent extent) {
    if (extent.count == 0) {
        return;
    }
    in_use_ -= extent.count;
    insert_free(extent);
}

uint64_t PagePool::trim() {
    uint64_t punched = 0;
    for (const auto & [first, count] : free_) {
        if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(first * unit_),
                      static_cast<off_t>(count * unit_)) == 0) {
            punched += count;
        }
    }
    held_ = in_use_;
    return punched;
}

}  // namespace bmoe::detail
