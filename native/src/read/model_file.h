// One file of a model, opened once and kept open for the engine's life, with the identity it had
// when opened: (device, inode, size, mtime). Everything that reads the file reads *this* inode:
// the lanes reopen it and check that the path still names it. What is checked later:
//   unchanged(): the open inode's size and mtime (fstat): a rewrite in place or a truncation;
//   same_as_path(): the path still names the open inode (stat): a rename-over during open.
// A model renamed over while running keeps running on the old file (it is held open, as any Unix
// reader would); the next open gets the new one.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace bmoe::detail {

struct FileIdentity {
    dev_t device = 0;
    ino_t inode = 0;
    uint64_t size = 0;
    int64_t mtime_ns = 0;
};

class ModelFile {
public:
    // Throws bmoe::Error naming the file: missing, unreadable, not a regular file.
    explicit ModelFile(std::string path);
    ~ModelFile();
    ModelFile(const ModelFile &) = delete;
    ModelFile & operator=(const ModelFile &) = delete;

    const std::string & path() const { return path_; }
    int fd() const { return fd_; }
    const FileIdentity & identity() const { return identity_; }
    uint64_t size() const { return identity_.size; }

    // Empty when the open file still has the size and mtime it had when opened; else one line
    // saying what changed (the caller decides whether that is an error).
    std::string changed() const;
    // Throws bmoe::Error when changed() is not empty.
    void check_unchanged() const;
    // Throws bmoe::Error when the path no longer names the open file (replaced while opening).
    void check_same_as_path() const;
    // Another descriptor of the same file with these open(2) flags, checked to be the same inode.
    // Returns -1 with errno set when open itself fails (the caller may fall back); throws when the
    // path now names another file.
    int reopen(int flags) const;

private:
    std::string path_;
    int fd_ = -1;
    FileIdentity identity_;
};

}  // namespace bmoe::detail
