#include "read/bench_reader.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "bmoe/error.h"
#include "read/mirror.h"
#include "read/model_file.h"
#include "read/page_pool.h"
#include "read/read_lanes.h"
#include "read/slice_file.h"

namespace bmoe::detail {

BenchReader::BenchReader(const std::string & path, int lanes, ReadPath read_path, int page_kb) {
    model_file_ = std::make_unique<ModelFile>(path);
    if (lanes < 1 || lanes > 64) {
        throw Error("lanes must be between 1 and 64, got " + std::to_string(lanes));
    }
    const auto kernel_page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    pool_ = std::make_unique<PagePool>(page_kb > 0 ? static_cast<uint64_t>(page_kb) * 1024 : kernel_page,
                                       model_file_->size());
    mirror_ = std::make_unique<Mirror>(model_file_->size(), *pool_);
    file_ = std::make_unique<SliceFile>(*model_file_, read_path, lanes, mirror_->base());
    lanes_ = std::make_unique<ReadLanes>(lanes, FaultInjection{});
}

BenchReader::~BenchReader() = default;  // lanes first (declared last), the pool last

ReadPath BenchReader::path_used() const { return file_->path_used(); }

const std::string & BenchReader::note() const { return file_->note(); }

BatchTiming BenchReader::read(const std::vector<std::pair<uint64_t, uint64_t>> & ranges) {
    std::vector<ReadJob> jobs;
    for (const auto & [offset, length] : ranges) {
        mirror_->acquire(offset, length);  // admission, as the streamer does it
        jobs.push_back({file_.get(), offset, length});
    }
    auto batch = std::make_shared<Batch>(std::move(jobs));
    const auto t0 = std::chrono::steady_clock::now();
    lanes_->submit(batch);
    std::string error;
    try {
        batch->wait();
    } catch (const std::exception & e) {
        error = e.what();
    }
    BatchTiming timing;
    timing.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const auto & [offset, length] : ranges) {
        mirror_->release(offset, length);  // eviction, as the streamer does it
    }
    if (!error.empty()) {
        throw Error(error);
    }
    timing.storage_bytes = batch->storage_bytes();
    timing.read_ms = batch->job_ms();
    return timing;
}

}  // namespace bmoe::detail
