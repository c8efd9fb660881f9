// Read lanes: N threads, each with its own descriptors (its lane index), draining one queue of
// slice reads. A batch is the set of reads one layer needs; the eval thread waits for all of it,
// and an optional per-job callback reports each slice as it lands (overlap readiness). Any failure
// is kept and rethrown to the waiter. A job may carry the slice's expected CRC-32C: the lane checks
// the bytes in place, reads once more on a mismatch, and fails the job if they still differ. A
// waiter may give a deadline: a batch that makes no progress (no read starting or ending) for that
// long is abandoned: the wait throws, the batch is marked timed out, and its callback stops; the
// lane stuck in the read finishes it whenever the kernel returns.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bmoe/config.h"

namespace bmoe::detail {

class LaneBuffer;
class SliceFile;
class SliceLayout;

struct ReadJob {
    const SliceFile * file = nullptr;
    uint64_t offset = 0;
    uint64_t length = 0;
    bool verify = false;  // check crc32c after the read (re-read once on a mismatch)
    uint32_t crc32c = 0;
    std::string what;     // for messages: which tensor and expert these bytes are
    // Not null: the bytes are read into the lane's buffer, checked there and converted into the mirror
    // (whole slices of this layout). Outlives the job.
    const SliceLayout * layout = nullptr;
};

class Batch {
public:
    using Clock = std::chrono::steady_clock;

    using JobDone = std::function<void(size_t index, bool ok)>;

    // `on_job_done` (optional) runs on the lane thread as each job finishes, before waiters wake.
    explicit Batch(std::vector<ReadJob> jobs, JobDone on_job_done = nullptr);

    const std::vector<ReadJob> & jobs() const { return jobs_; }
    // Block until every job is done; throws bmoe::Error if any failed (unless `throw_failed` is
    // false: then job_ok() says which). With timeout_s > 0, also throws when no read started or
    // ended for that long (then timed_out() is true and the batch is abandoned: its callback no
    // longer runs).
    void wait(double timeout_s = 0, bool throw_failed = true);
    // Jobs not yet started are dropped (they count as done, are not read, and their callback does
    // not run); jobs a lane is reading finish normally. Read-ahead uses it for wrong guesses.
    void cancel_queued(const std::vector<size_t> & indices);
    void cancel_queued();  // every job not yet started
    // Once the job is done: its bytes landed (false: it failed or was cancelled).
    bool job_ok(size_t i);
    bool done() const { return remaining_.load(std::memory_order_acquire) == 0; }
    bool timed_out() const { return timed_out_.load(); }
    // Slices whose first read did not match their checksum and were read again.
    uint64_t rereads() const { return rereads_.load(); }

    uint64_t storage_bytes() const { return storage_bytes_.load(); }
    // How long each job's read took (ms), by job index, once the batch is done.
    const std::vector<float> & job_ms() const { return job_ms_; }
    uint64_t copy_bytes() const { return copy_bytes_.load(); }
    // Lane time spent converting slices into the kernels' layout, summed over the lanes.
    double convert_ms() const { return static_cast<double>(convert_ns_.load()) / 1e6; }
    // Wall time from the first read starting to the last one finishing.
    double io_ms() const;

private:
    friend class ReadLanes;
    bool start(size_t i);  // false: the job was cancelled
    void finish(size_t i, uint64_t storage, uint64_t copies, float ms, const std::string * error);
    std::string hung_job() const;  // under mutex_: the first read started and not finished

    std::vector<ReadJob> jobs_;
    JobDone on_job_done_;
    std::atomic<size_t> remaining_;
    std::atomic<uint64_t> storage_bytes_{0};
    std::atomic<uint64_t> copy_bytes_{0};
    std::atomic<uint64_t> rereads_{0};
    std::atomic<uint64_t> convert_ns_{0};
    std::atomic<bool> timed_out_{false};
    std::vector<float> job_ms_;  // each slot written by the one lane that ran the job
    std::mutex mutex_;
    std::condition_variable cv_;
    std::string error_;
    bool failed_ = false;
    Clock::time_point first_start_{};
    Clock::time_point last_end_{};
    Clock::time_point last_progress_{};
    std::vector<uint8_t> state_;  // per job: 0 queued, 1 reading, 2 done, 3 cancelled, 4 failed
    bool started_ = false;
};

// Urgent reads (what a layer is about to compute) go before background ones (read-ahead).
enum class ReadPriority { Urgent, Background };

class ReadLanes {
public:
    ReadLanes(int lanes, FaultInjection fault);
    ~ReadLanes();
    ReadLanes(const ReadLanes &) = delete;
    ReadLanes & operator=(const ReadLanes &) = delete;

    // Give every lane a buffer of `bytes` now (the largest converted read), touched, so the memory it takes is
    // in the process's footprint from the first step on, not found page by page under a read.
    void reserve_buffers(uint64_t bytes);

    // Queue every job of the batch (in order) and return at once. The batch must outlive its jobs.
    void submit(const std::shared_ptr<Batch> & batch, ReadPriority priority = ReadPriority::Urgent);

private:
    struct Task {
        std::shared_ptr<Batch> batch;
        size_t index;
    };
    void run(int lane);
    void execute(int lane, const Task & task);

    FaultInjection fault_;
    std::atomic<int64_t> reads_{0};
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<Task> urgent_;
    std::deque<Task> background_;
    bool stopping_ = false;
    std::vector<std::thread> threads_;
    std::vector<std::unique_ptr<LaneBuffer>> buffers_;  // one a lane: only its own thread touches it
};

}  // namespace bmoe::detail
