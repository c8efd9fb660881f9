#include "read/read_lanes.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

#include "bmoe/error.h"
#include "core/crc32c.h"
#include "read/slice_file.h"
#include "read/slice_layout.h"

namespace bmoe::detail {

Batch::Batch(std::vector<ReadJob> jobs, JobDone on_job_done)
    : jobs_(std::move(jobs)), on_job_done_(std::move(on_job_done)), remaining_(jobs_.size()), job_ms_(jobs_.size(), 0),
      state_(jobs_.size(), 0) {}

bool Batch::start(size_t i) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (state_[i] == 3) {
        return false;
    }
    state_[i] = 1;
    last_progress_ = Clock::now();
    return true;
}

void Batch::cancel_queued(const std::vector<size_t> & indices) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (size_t i : indices) {
            if (i < state_.size() && state_[i] == 0) {
                state_[i] = 3;
                remaining_.fetch_sub(1, std::memory_order_acq_rel);
            }
        }
    }
    cv_.notify_all();
}

void Batch::cancel_queued() {
    std::vector<size_t> all(jobs_.size());
    for (size_t i = 0; i < all.size(); ++i) {
        all[i] = i;
    }
    cancel_queued(all);
}

bool Batch::job_ok(size_t i) {
    std::lock_guard<std::mutex> lock(mutex_);
    return i < state_.size() && state_[i] == 2;
}

void Batch::finish(size_t i, uint64_t storage, uint64_t copies, float ms, const std::string * error) {
    job_ms_[i] = ms;
    storage_bytes_ += storage;
    copy_bytes_ += copies;
    if (on_job_done_ && !timed_out_.load()) {  // an abandoned batch's waiters are gone
        on_job_done_(i, error == nullptr);
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        last_end_ = Clock::now();
        last_progress_ = last_end_;
        state_[i] = error == nullptr ? 2 : 4;
        if (error != nullptr && !failed_) {
            failed_ = true;
            error_ = *error;
        }
        remaining_.fetch_sub(1, std::memory_order_acq_rel);
    }
    cv_.notify_all();
}

void Batch::wait(double timeout_s, bool throw_failed) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto done = [&] { return remaining_.load(std::memory_order_acquire) == 0; };
    if (timeout_s <= 0) {
        cv_.wait(lock, done);
    } else {
        const auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
        while (!done()) {
            const Clock::time_point deadline = last_progress_ + timeout;
            if (Clock::now() >= deadline) {
                timed_out_.store(true);
                char seconds[32];
                std::snprintf(seconds, sizeof(seconds), "%g", timeout_s);
                throw Error(hung_job() + " did not complete within the I/O deadline of " + seconds +
                            " s (--io-timeout): the storage is not answering");
            }
            cv_.wait_until(lock, deadline, done);
        }
    }
    if (failed_ && throw_failed) {
        throw Error(error_);
    }
}

std::string Batch::hung_job() const {
    size_t pick = jobs_.size();
    for (size_t i = 0; i < jobs_.size() && pick == jobs_.size(); ++i) {
        pick = state_[i] == 1 ? i : pick;
    }
    for (size_t i = 0; i < jobs_.size() && pick == jobs_.size(); ++i) {
        pick = state_[i] == 0 ? i : pick;  // none reading: a lane is stuck in another batch's read
    }
    if (pick == jobs_.size()) {
        return "a read";
    }
    const ReadJob & j = jobs_[pick];
    return std::string(state_[pick] == 1 ? "the read" : "a read") + " of " + std::to_string(j.length) +
           " bytes at offset " + std::to_string(j.offset) + " of " + j.file->path() +
           (j.what.empty() ? "" : " (" + j.what + ")") + (state_[pick] == 1 ? "" : ", queued behind a stuck read,");
}

double Batch::io_ms() const {
    if (!started_ || jobs_.empty()) {
        return 0.0;
    }
    return std::chrono::duration<double, std::milli>(last_end_ - first_start_).count();
}

ReadLanes::ReadLanes(int lanes, FaultInjection fault) : fault_(fault) {
    for (int i = 0; i < lanes; ++i) {
        buffers_.push_back(std::make_unique<LaneBuffer>());
    }
    for (int i = 0; i < lanes; ++i) {
        threads_.emplace_back([this, i] { run(i); });
    }
}

void ReadLanes::reserve_buffers(uint64_t bytes) {
    for (auto & b : buffers_) {
        std::memset(b->reserve(bytes), 0, b->capacity());  // touched: resident now, as it will be
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

void ReadLanes::submit(const std::shared_ptr<Batch> & batch, ReadPriority priority) {
    if (batch->jobs().empty()) {
        return;
    }
    {
        std::lock_guard<std::mutex> lock(batch->mutex_);
        batch->first_start_ = Batch::Clock::now();
        batch->last_progress_ = batch->first_start_;
        batch->started_ = true;
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        std::deque<Task> & queue = priority == ReadPriority::Urgent ? urgent_ : background_;
        for (size_t i = 0; i < batch->jobs().size(); ++i) {
            queue.push_back({batch, i});
        }
    }
    cv_.notify_all();
}

void ReadLanes::run(int lane) {
    for (;;) {
        Task task;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            cv_.wait(lock, [&] { return stopping_ || !urgent_.empty() || !background_.empty(); });
            std::deque<Task> & queue = urgent_.empty() ? background_ : urgent_;
            if (queue.empty()) {
                return;  // stopping and drained
            }
            task = std::move(queue.front());
            queue.pop_front();
        }
        execute(lane, task);
    }
}

void ReadLanes::execute(int lane, const Task & task) {
    const ReadJob & job = task.batch->jobs()[task.index];
    if (!task.batch->start(task.index)) {
        return;  // cancelled while queued: a read-ahead the router did not confirm
    }
    const int64_t n = ++reads_;
    const bool injected = fault_.kind != FaultKind::None && (fault_.onward ? n >= fault_.nth : n == fault_.nth);
    const auto t0 = Batch::Clock::now();
    auto ms = [&] { return std::chrono::duration<float, std::milli>(Batch::Clock::now() - t0).count(); };
    auto failed = [&](const std::string & why) {
        return "read of " + std::to_string(job.length) + " bytes at offset " + std::to_string(job.offset) + " of " +
               job.file->path() + " failed: " + why;
    };
    try {
        if (injected && fault_.kind == FaultKind::Fail) {
            throw Error(failed("injected fault (read #" + std::to_string(n) + ")"));
        }
        if (injected && fault_.kind == FaultKind::Hang) {
            std::this_thread::sleep_for(std::chrono::duration<double>(fault_.hang_s));  // a device that stalls
        }
        // A converted slice is read and checked in the lane's buffer; the mirror only ever gets its conversion.
        LaneBuffer & buffer = *buffers_[static_cast<size_t>(lane)];
        auto read = [&](uint64_t length, const uint8_t ** at) {
            if (job.layout != nullptr) {
                return job.file->read_into(lane, job.offset, length, buffer, at);
            }
            *at = job.file->mirror_base() + job.offset;
            return job.file->read(lane, job.offset, length);
        };
        const uint8_t * bytes = nullptr;
        if (injected && fault_.kind == FaultKind::Short) {
            read(job.length / 2, &bytes);  // half of it lands, then the file "ends"
            throw Error(failed("short read (" + std::to_string(job.length / 2) + " bytes, injected fault read #" +
                               std::to_string(n) + ")"));
        }
        ReadResult r = read(job.length, &bytes);
        if (injected && fault_.kind == FaultKind::Corrupt) {
            // Invert 256 bytes in the middle of the slice, as a bad flash page would garble them.
            // (One flipped byte is not enough: activations are quantized for the dot products,
            // and a weight that meets a zero activation changes nothing.)
            const uint64_t span = std::min<uint64_t>(256, job.length);
            uint8_t * mid = const_cast<uint8_t *>(bytes) + (job.length - span) / 2;
            for (uint64_t i = 0; i < span; ++i) {
                mid[i] ^= 0xFF;
            }
        }
        if (job.verify && crc32c(bytes, job.length) != job.crc32c) {
            task.batch->rereads_.fetch_add(1);
            const ReadResult again = read(job.length, &bytes);
            r.storage_bytes += again.storage_bytes;
            r.copy_bytes += again.copy_bytes;
            const uint32_t got = crc32c(bytes, job.length);
            if (got != job.crc32c) {
                char sums[64];
                std::snprintf(sums, sizeof(sums), "CRC-32C %08x, expected %08x", got, job.crc32c);
                throw Error("checksum mismatch in " + (job.what.empty() ? std::string("a slice") : job.what) + ": " +
                            std::to_string(job.length) + " bytes at offset " + std::to_string(job.offset) + " of " +
                            job.file->path() + " read twice, " + sums +
                            ": the model file is damaged on the storage (bmoe-edge verify-model checks all of it)");
            }
        }
        if (job.layout != nullptr) {
            const auto c0 = Batch::Clock::now();
            job.layout->convert(bytes, job.file->mirror_base() + job.offset, job.length);
            task.batch->convert_ns_ += static_cast<uint64_t>(
                std::chrono::duration_cast<std::chrono::nanoseconds>(Batch::Clock::now() - c0).count());
        }
        task.batch->finish(task.index, r.storage_bytes, r.copy_bytes, ms(), nullptr);
    } catch (const std::exception & e) {
        const std::string message = e.what();
        task.batch->finish(task.index, 0, 0, ms(), &message);
    }
}

}  // namespace bmoe::detail
