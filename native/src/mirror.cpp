#include "mirror.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "bmoe/error.h"

namespace bmoe::detail {

Mirror::Mirror(uint64_t file_size, size_t page_size)
    : size_(file_size), page_size_(page_size), page_refs_((file_size + page_size - 1) / page_size, 0) {
    // MAP_NORESERVE: the reservation is virtual; only pages we read into become memory.
    void * p = mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        throw Error(std::string("cannot reserve the expert mirror (") + std::to_string(file_size) +
                    " bytes of address space): " + std::strerror(errno));
    }
    base_ = static_cast<uint8_t *>(p);
}

Mirror::~Mirror() {
    if (base_ != nullptr) {
        munmap(base_, size_);
    }
}

void Mirror::acquire(uint64_t offset, uint64_t length) {
    if (length == 0) {
        return;
    }
    const uint64_t first = offset / page_size_;
    const uint64_t last = (offset + length - 1) / page_size_;
    for (uint64_t p = first; p <= last; ++p) {
        if (page_refs_[p]++ == 0) {
            ++resident_pages_;
        }
    }
}

void Mirror::release(uint64_t offset, uint64_t length) {
    if (length == 0) {
        return;
    }
    const uint64_t first = offset / page_size_;
    const uint64_t last = (offset + length - 1) / page_size_;
    uint64_t run_start = 0;
    uint64_t run_len = 0;
    auto flush = [&] {
        if (run_len > 0) {
            // Contents are dropped; the next read of any slice on these pages rewrites them.
            madvise(base_ + run_start * page_size_, run_len * page_size_, MADV_DONTNEED);
            run_len = 0;
        }
    };
    for (uint64_t p = first; p <= last; ++p) {
        if (page_refs_[p] == 0) {
            throw Error("internal error: mirror page released more often than acquired");
        }
        if (--page_refs_[p] == 0) {
            --resident_pages_;
            if (run_len == 0) {
                run_start = p;
            }
            ++run_len;
        } else {
            flush();
        }
    }
    flush();
}

}  // namespace bmoe::detail
