#include "read_lanes.h"

#include <algorithm>

#include "bmoe/error.h"
#include "slice_file.h"

namespace bmoe::detail {

Batch::Batch(std::vector<ReadJob> jobs, JobDone on_job_done)
    : jobs_(std::move(jobs)), on_job_done_(std::move(on_job_done)), remaining_(jobs_.size()), job_ms_(jobs_.size(), 0) {}

void Batch::finish(size_t i, uint64_t storage, uint64_t copies, float ms, const std::string * error) {
    job_ms_[i] = ms;
    storage_bytes_ += storage;
    copy_bytes_ += copies;
    if (on_job_done_) {
        on_job_done_(i, error == nullptr);
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        last_end_ = Clock::now();
        if (error != nullptr && !failed_) {
            failed_ = true;
            error_ = *error;
        }
        remaining_.fetch_sub(1, std::memory_order_acq_rel);
    }
    cv_.notify_all();
}

void Batch::wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return remaining_.load(std::memory_order_acquire) == 0; });
    if (failed_) {
        throw Error(error_);
    }
}

double Batch::io_ms() const {
    if (!started_ || jobs_.empty()) {
        return 0.0;
    }
    return std::chrono::duration<double, std::milli>(last_end_ - first_start_).count();
}

ReadLanes::ReadLanes(int lanes, FaultInjection fault) : fault_(fault) {
    for (int i = 0; i < lanes; ++i) {
        threads_.emplace_back([this, i] { run(i); });
    }
}

ReadLanes::~ReadLanes() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
    }
    cv_.notify_all();
    for (auto & t : threads_) {
        t.join();
    }
}

void ReadLanes::submit(const std::shared_ptr<Batch> & batch) {
    if (batch->jobs().empty()) {
        return;
    }
    {
        std::lock_guard<std::mutex> lock(batch->mutex_);
        batch->first_start_ = Batch::Clock::now();
        batch->started_ = true;
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (size_t i = 0; i < batch->jobs().size(); ++i) {
            queue_.push_back({batch, i});
        }
    }
    cv_.notify_all();
}

void ReadLanes::run(int lane) {
    for (;;) {
        Task task;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
            if (queue_.empty()) {
                return;  // stopping and drained
            }
            task = std::move(queue_.front());
            queue_.pop_front();
        }
        execute(lane, task);
    }
}

void ReadLanes::execute(int lane, const Task & task) {
    const ReadJob & job = task.batch->jobs()[task.index];
    const int64_t n = ++reads_;
    const bool injected = fault_.kind != FaultKind::None && n == fault_.nth;
    const auto t0 = Batch::Clock::now();
    auto ms = [&] { return std::chrono::duration<float, std::milli>(Batch::Clock::now() - t0).count(); };
    try {
        if (injected && fault_.kind == FaultKind::Fail) {
            throw Error("read of " + std::to_string(job.length) + " bytes at offset " + std::to_string(job.offset) +
                        " of " + job.file->path() + " failed: injected fault (read #" + std::to_string(n) + ")");
        }
        const ReadResult r = job.file->read(lane, job.offset, job.length);
        if (injected && fault_.kind == FaultKind::Corrupt) {
            // Invert 256 bytes in the middle of the slice, as a bad flash page would garble them.
            // (One flipped byte is not enough: activations are quantized for the dot products,
            // and a weight that meets a zero activation changes nothing.)
            const uint64_t span = std::min<uint64_t>(256, job.length);
            uint8_t * bytes = job.file->mirror_base() + job.offset + (job.length - span) / 2;
            for (uint64_t i = 0; i < span; ++i) {
                bytes[i] ^= 0xFF;
            }
        }
        task.batch->finish(task.index, r.storage_bytes, r.copy_bytes, ms(), nullptr);
    } catch (const std::exception & e) {
        const std::string message = e.what();
        task.batch->finish(task.index, 0, 0, ms(), &message);
    }
}

}  // namespace bmoe::detail
