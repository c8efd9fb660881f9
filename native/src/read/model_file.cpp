#include "read/model_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "bmoe/error.h"

namespace bmoe::detail {
namespace {

int64_t mtime_ns(const struct stat & st) {
    return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
}

std::string reopen_hint() { return "the model was rewritten or truncated while in use; reopen it (and keep models "
                                   "read-only while an engine runs them)"; }

}  // namespace

ModelFile::ModelFile(std::string path) : path_(std::move(path)) {
    fd_ = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
        throw Error(path_ + ": " + std::strerror(errno));
    }
    struct stat st {};
    if (fstat(fd_, &st) != 0) {
        const int err = errno;
        close(fd_);
        throw Error(path_ + ": cannot stat: " + std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd_);
        throw Error(path_ + ": not a regular file");
    }
    identity_ = {st.st_dev, st.st_ino, static_cast<uint64_t>(st.st_size), mtime_ns(st)};
}

ModelFile::~ModelFile() {
    if (fd_ >= 0) {
        close(fd_);
    }
}

std::string ModelFile::changed() const {
    struct stat st {};
    if (fstat(fd_, &st) != 0) {
        return path_ + ": cannot stat the open model file: " + std::strerror(errno);
    }
    const auto size = static_cast<uint64_t>(st.st_size);
    if (size != identity_.size) {
        return path_ + ": the model file changed on disk (" + std::to_string(identity_.size) + " bytes when opened, " +
               std::to_string(size) + " now): " + reopen_hint();
    }
    if (mtime_ns(st) != identity_.mtime_ns) {
        return path_ + ": the model file changed on disk (modified after it was opened): " + reopen_hint();
    }
    return "";
}

void ModelFile::check_unchanged() const {
    const std::string why = changed();
    if (!why.empty()) {
        throw Error(why);
    }
}

void ModelFile::check_same_as_path() const {
    struct stat st {};
    if (stat(path_.c_str(), &st) != 0) {
        throw Error(path_ + ": the model file disappeared while it was being opened (" + std::strerror(errno) + ")");
    }
    if (st.st_dev != identity_.device || st.st_ino != identity_.inode) {
        throw Error(path_ + ": the model file was replaced while it was being opened; open it again");
    }
}

int ModelFile::reopen(int flags) const {
    const int fd = open(path_.c_str(), flags | O_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || st.st_dev != identity_.device || st.st_ino != identity_.inode) {
        close(fd);
        throw Error(path_ + ": the model file was replaced while it was being opened; open it again");
    }
    return fd;
}

}  // namespace bmoe::detail
