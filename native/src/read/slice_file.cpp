#include "read/slice_file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "bmoe/error.h"
#include "read/model_file.h"

namespace bmoe::detail {
namespace {

uint64_t align_down(uint64_t v, uint64_t a) { return v - v % a; }
uint64_t align_up(uint64_t v, uint64_t a) { return align_down(v + a - 1, a); }

// statx's DIO alignment where the kernel reports it; else the block device's logical block size;
// else 4096. 0 means the filesystem reports no O_DIRECT support through statx (tmpfs).
uint64_t query_dio_align(const std::string & path) {
    struct statx stx {};
    // Zeros with the bit set mean "no direct I/O" from a filesystem, or an emulator (qemu-user)
    // that does not pass the fields through: fall through to the device's block size.
    if (statx(AT_FDCWD, path.c_str(), 0, STATX_DIOALIGN, &stx) == 0 && (stx.stx_mask & STATX_DIOALIGN) &&
        stx.stx_dio_offset_align > 0 && stx.stx_dio_mem_align > 0) {
        return std::max<uint64_t>(stx.stx_dio_offset_align, stx.stx_dio_mem_align);
    }
    struct stat st {};
    if (stat(path.c_str(), &st) == 0) {
        std::ifstream f("/sys/dev/block/" + std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev)) +
                        "/queue/logical_block_size");
        uint64_t block = 0;
        if (f >> block && block > 0) {
            return block;
        }
    }
    return 4096;
}

[[noreturn]] void read_error(const std::string & path, uint64_t offset, uint64_t length, const std::string & why) {
    throw Error("read of " + std::to_string(length) + " bytes at offset " + std::to_string(offset) + " of " + path +
                " failed: " + why);
}

// pread until `length` bytes or EOF; returns bytes read.
uint64_t pread_full(int fd, uint8_t * dst, uint64_t length, uint64_t offset, const std::string & path) {
    uint64_t done = 0;
    while (done < length) {
        const ssize_t n = pread(fd, dst + done, length - done, static_cast<off_t>(offset + done));
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            read_error(path, offset, length, std::strerror(errno));
        }
        if (n == 0) {
            break;  // EOF
        }
        done += static_cast<uint64_t>(n);
    }
    return done;
}

}  // namespace

SliceFile::SliceFile(const ModelFile & file, ReadPath requested, int lanes, uint8_t * mirror_base)
    : file_(file), path_(file.path()), size_(file.size()), base_(mirror_base), used_(requested) {
    open_lanes(lanes);
    if (requested == ReadPath::ODirect) {
        std::string why;
        if (!verify_direct(why)) {
            used_ = ReadPath::Pread;
            note_ = "O_DIRECT unusable on " + path_ + " (" + why + "): using pread";
            for (int fd : direct_fds_) {
                close(fd);
            }
            direct_fds_.clear();
        }
    }
}

SliceFile::~SliceFile() {
    for (int fd : buffered_fds_) {
        close(fd);
    }
    for (int fd : direct_fds_) {
        close(fd);
    }
}

void SliceFile::open_lanes(int lanes) {
    for (int i = 0; i < lanes; ++i) {
        const int fd = file_.reopen(O_RDONLY);
        if (fd < 0) {
            throw Error(path_ + ": cannot open for reading: " + std::strerror(errno));
        }
        buffered_fds_.push_back(fd);
    }
}

bool SliceFile::verify_direct(std::string & why) {
    // Memory-backed filesystems may accept O_DIRECT but it is not direct I/O there, and FUSE's
    // O_DIRECT semantics depend on the daemon: both get pread.
    struct statfs fs {};
    if (statfs(path_.c_str(), &fs) == 0) {
        if (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC) {
            why = "a memory-backed filesystem (tmpfs/ramfs) has no direct I/O";
            return false;
        }
        if (fs.f_type == FUSE_SUPER_MAGIC) {
            why = "FUSE filesystems do not promise O_DIRECT semantics";
            return false;
        }
    }
    dio_align_ = query_dio_align(path_);
    const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (page % dio_align_ != 0) {
        // The mirror is only page aligned; a coarser requirement cannot be met in place.
        why = "needs " + std::to_string(dio_align_) + "-byte alignment, more than the page size";
        return false;
    }
    for (size_t i = 0; i < buffered_fds_.size(); ++i) {
        const int fd = file_.reopen(O_RDONLY | O_DIRECT);
        if (fd < 0) {
            why = std::string("open with O_DIRECT: ") + std::strerror(errno);
            return false;
        }
        direct_fds_.push_back(fd);
    }
    // Read one aligned block both ways and compare: some filesystems accept the flag and lie.
    const uint64_t block = std::max<uint64_t>(dio_align_, 4096);
    const uint64_t length = std::min<uint64_t>(block, align_down(size_, dio_align_));
    if (length == 0) {
        why = "file smaller than one aligned block";
        return false;
    }
    void * direct_buf = nullptr;
    if (posix_memalign(&direct_buf, 4096, block) != 0) {
        why = "out of memory";
        return false;
    }
    std::unique_ptr<void, void (*)(void *)> guard(direct_buf, &std::free);
    std::vector<uint8_t> buffered(length);
    const ssize_t nd = pread(direct_fds_[0], direct_buf, length, 0);
    if (nd != static_cast<ssize_t>(length)) {
        why = nd < 0 ? std::string("O_DIRECT read: ") + std::strerror(errno) : "short O_DIRECT read";
        return false;
    }
    if (pread_full(buffered_fds_[0], buffered.data(), length, 0, path_) != length ||
        std::memcmp(direct_buf, buffered.data(), length) != 0) {
        why = "O_DIRECT and buffered reads differ";
        return false;
    }
    return true;
}

void SliceFile::check_range(int lane, uint64_t offset, uint64_t length) const {
    if (lane < 0 || static_cast<size_t>(lane) >= buffered_fds_.size() || offset > size_ || length > size_ - offset) {
        read_error(path_, offset, length, "range past the end of the file");
    }
}

ReadResult SliceFile::read(int lane, uint64_t offset, uint64_t length) const {
    check_range(lane, offset, length);
    return used_ == ReadPath::ODirect ? read_direct(lane, offset, length, base_, 0)
                                      : read_buffered(lane, offset, length, base_, 0);
}

uint64_t SliceFile::buffer_bytes(uint64_t length) const {
    return used_ == ReadPath::ODirect ? length + 2 * dio_align_ : length;
}

ReadResult SliceFile::read_into(int lane, uint64_t offset, uint64_t length, LaneBuffer & buffer,
                                const uint8_t ** bytes) const {
    check_range(lane, offset, length);
    const uint64_t origin = used_ == ReadPath::ODirect ? align_down(offset, dio_align_) : offset;
    uint8_t * to = buffer.reserve(offset + length - origin + (used_ == ReadPath::ODirect ? dio_align_ : 0));
    *bytes = to + (offset - origin);
    ReadResult r = used_ == ReadPath::ODirect ? read_direct(lane, offset, length, to, origin)
                                              : read_buffered(lane, offset, length, to, origin);
    r.copy_bytes += length;  // through the buffer
    return r;
}

void SliceFile::drop_unmapped_page_cache() const {
    if (!buffered_fds_.empty()) {
        posix_fadvise(buffered_fds_[0], 0, 0, POSIX_FADV_DONTNEED);  // advice: a failure changes nothing
    }
}

ReadResult SliceFile::read_buffered(int lane, uint64_t offset, uint64_t length, uint8_t * to, uint64_t origin) const {
    const uint64_t n = pread_full(buffered_fds_[lane], to + (offset - origin), length, offset, path_);
    if (n != length) {
        read_error(path_, offset, length, "short read (" + std::to_string(n) + " bytes): the file changed or is truncated");
    }
    return {length, 0};
}

ReadResult SliceFile::read_direct(int lane, uint64_t offset, uint64_t length, uint8_t * to, uint64_t origin) const {
    // The window's edge blocks belong to neighbouring slices. In the mirror they hold the exact file bytes
    // those slices hold, so writing them there is harmless (their pages are ours: the window never leaves the
    // slice's first and last page because dio_align divides the page size); where a neighbour may hold
    // converted bytes, the read goes through a lane's buffer instead (read_into).
    const uint64_t start = align_down(offset, dio_align_);
    const uint64_t end = std::min(align_up(offset + length, dio_align_), align_down(size_, dio_align_));
    uint64_t got = 0;
    if (end > start) {
        got = pread_full(direct_fds_[lane], to + (start - origin), end - start, start, path_);
    }
    ReadResult result{got, 0};
    // The unaligned tail at the end of the file cannot be read with O_DIRECT: read it buffered.
    if (start + got < offset + length) {
        const uint64_t tail = start + got;
        const uint64_t n = pread_full(buffered_fds_[lane], to + (tail - origin), offset + length - tail, tail, path_);
        if (tail + n != offset + length) {
            read_error(path_, offset, length, "short read: the file changed or is truncated");
        }
        result.storage_bytes += n;
    }
    return result;
}

LaneBuffer::~LaneBuffer() { std::free(data_); }

uint8_t * LaneBuffer::reserve(uint64_t bytes) {
    if (bytes > capacity_) {
        std::free(data_);
        data_ = nullptr;
        capacity_ = 0;
        const uint64_t rounded = align_up(bytes, 1ULL << 16);
        void * p = nullptr;
        if (posix_memalign(&p, static_cast<size_t>(sysconf(_SC_PAGESIZE)), rounded) != 0) {
            throw Error("out of memory for a read lane's buffer (" + std::to_string(rounded) + " bytes)");
        }
        data_ = static_cast<uint8_t *>(p);
        capacity_ = rounded;
    }
    return data_;
}

}  // namespace bmoe::detail
