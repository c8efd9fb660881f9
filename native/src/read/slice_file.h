// Reading byte ranges of one model file straight into its mirror: O_DIRECT of the aligned window
// (no bounce buffer: the mirror has the file's page phase) or pread of the exact range. Each read
// lane has its own descriptors, reopened from the model's one open file (ModelFile) and checked
// to be the same inode. O_DIRECT is verified once per file; where the filesystem refuses it or
// returns different bytes, the file falls back to pread and says why.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bmoe/config.h"

namespace bmoe::detail {

struct ReadResult {
    uint64_t storage_bytes = 0;  // bytes requested from the file, alignment windows included
    uint64_t copy_bytes = 0;     // bytes that went through an intermediate buffer
};

class ModelFile;

// A lane's own buffer for reads converted before they land in the mirror (slice_layout.h): page aligned,
// as O_DIRECT needs, grown to the largest read and kept.
class LaneBuffer {
public:
    LaneBuffer() = default;
    ~LaneBuffer();
    LaneBuffer(const LaneBuffer &) = delete;
    LaneBuffer & operator=(const LaneBuffer &) = delete;
    // At least `bytes` (the contents are not kept when it grows). Throws bmoe::Error when out of memory.
    uint8_t * reserve(uint64_t bytes);
    uint64_t capacity() const { return capacity_; }

private:
    uint8_t * data_ = nullptr;
    uint64_t capacity_ = 0;
};

class SliceFile {
public:
    // `file` must outlive this object.
    SliceFile(const ModelFile & file, ReadPath requested, int lanes, uint8_t * mirror_base);
    ~SliceFile();
    SliceFile(const SliceFile &) = delete;
    SliceFile & operator=(const SliceFile &) = delete;

    ReadPath path_used() const { return used_; }
    const std::string & note() const { return note_; }
    uint64_t dio_align() const { return dio_align_; }
    const std::string & path() const { return path_; }
    const ModelFile & model_file() const { return file_; }
    uint8_t * mirror_base() const { return base_; }

    // Make [offset, offset+length) of the file appear at mirror_base + offset. Throws bmoe::Error
    // on any failure (EIO, a short read before EOF): the caller must not compute on the range.
    ReadResult read(int lane, uint64_t offset, uint64_t length) const;
    // The same range into `buffer` instead (the aligned window around it with O_DIRECT); `*bytes` is where
    // its first byte landed. Nothing of the mirror is written.
    ReadResult read_into(int lane, uint64_t offset, uint64_t length, LaneBuffer & buffer, const uint8_t ** bytes) const;
    // What read_into needs of a buffer for `length` bytes anywhere in the file.
    uint64_t buffer_bytes(uint64_t length) const;

    // Ask the kernel to drop the file's cached pages nobody maps (what loading read and left
    // behind); mapped pages, the dense weights in use, stay.
    void drop_unmapped_page_cache() const;

private:
    void open_lanes(int lanes);
    bool verify_direct(std::string & why);
    void check_range(int lane, uint64_t offset, uint64_t length) const;
    // Byte `o` of the file lands at `to + (o - origin)`.
    ReadResult read_buffered(int lane, uint64_t offset, uint64_t length, uint8_t * to, uint64_t origin) const;
    ReadResult read_direct(int lane, uint64_t offset, uint64_t length, uint8_t * to, uint64_t origin) const;

    const ModelFile & file_;
    std::string path_;
    uint64_t size_ = 0;
    uint8_t * base_ = nullptr;
    ReadPath used_ = ReadPath::Pread;
    std::string note_;
    uint64_t dio_align_ = 0;
    std::vector<int> buffered_fds_;
    std::vector<int> direct_fds_;
};

}  // namespace bmoe::detail
