// The streamer's waits (streamer.h): a compute thread waiting for its expert under overlap, the drains
// before a layer's reads are published, the I/O deadline's way out (a batch given up, its pages kept
// until the kernel is done with them), and the whole graphs that wait for nothing. Split from streamer.cpp,
// which admits and reads.
#include "stream/streamer.h"

#include <chrono>
#include <exception>
#include <mutex>
#include <thread>

#include "bmoe/error.h"
#include "read/read_lanes.h"

namespace bmoe::detail {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A slice read takes tens of microseconds at best: spin about that long before sleeping. (2000
// sched_yield calls were 39% of the CPU samples of a cache-off overlap run on 2 cores, taken from
// the read lanes; a bounded spin leaves them the cores.)
constexpr auto kSpinFor = std::chrono::microseconds(30);

}  // namespace

// A batch abandoned on its deadline may still have a read in the kernel, writing into the mirror
// when it returns. A buffered read resolves the addresses as it copies, so it can only write the
// file's bytes where they belong; an O_DIRECT read has pinned the pool's physical pages already,
// and if those went back to the pool and under another range, it would write into that one. So
// the layer's missing slices leave the cache but keep one reference on their units for the
// engine's life: those units are never recycled, and a later read of the same slices lands on the
// same pages with the same bytes. The cost is one layer's slices of memory per timeout, until the
// kernel has returned every read of the batch (reap_abandoned releases them then); reads of it not
// started yet are dropped at once.
void Streamer::give_up(const std::shared_ptr<Batch> & batch, int layer, const std::vector<int> & missing) {
    if (!batch->timed_out()) {
        forget(layer, missing);
        return;
    }
    cache_.evict_layer(layer, missing);
    abandon(batch, layer, missing);
}

void Streamer::abandon(const std::shared_ptr<Batch> & batch, int layer, std::vector<int> experts) {
    batch->cancel_queued();
    abandoned_.push_back({batch, layer, std::move(experts)});
    ++timeouts_in_a_row_;
}

// Before a layer's reads: abandoned batches the kernel has finished give their units back, and a
// storage that missed the deadline kHangLimit times in a row stops the engine with one line instead
// of pinning another layer of memory per timeout (a server on a disk that keeps hanging would grow
// until the OOM killer came). It stays stopped: the model has to be opened again.
void Streamer::reap_abandoned() {
    auto kept = abandoned_.begin();
    for (auto & a : abandoned_) {
        if (a.batch->done()) {
            for (int e : a.experts) {
                for_each_slice(a.layer, e, false);
            }
        } else {
            *kept++ = std::move(a);
        }
    }
    abandoned_.erase(kept, abandoned_.end());
    if (timeouts_in_a_row_ >= kHangLimit) {
        throw Error("the storage keeps hanging: " + std::to_string(timeouts_in_a_row_) +
                    " reads in a row missed the I/O deadline of " + std::to_string(static_cast<int>(io_timeout_s_)) +
                    " s (--io-timeout), " + std::to_string(abandoned_.size()) +
                    " still stuck in the kernel; the engine stops rather than hold more memory: check the storage, "
                    "then open the model again");
    }
}

void Streamer::drain() {
    std::exception_ptr ahead_error;  // both halves run: neither may leave a batch unsettled
    try {
        settle_ahead();
    } catch (...) {
        ahead_error = std::current_exception();
    }
    drain_in_flight();
    if (ahead_error) {
        std::rethrow_exception(ahead_error);
    }
}

void Streamer::drain_in_flight() {
    if (!in_flight_) {
        return;
    }
    const auto t0 = Clock::now();
    std::shared_ptr<Batch> batch = std::move(in_flight_);
    in_flight_.reset();
    auto take_wait_error = [this] {
        std::lock_guard<std::mutex> lock(wait_mutex_);
        std::string e;
        e.swap(wait_error_);
        return e;
    };
    try {
        batch->wait(io_timeout_s_);
    } catch (...) {
        give_up(batch, in_flight_layer_, in_flight_missing_);
        counters_.drain_ms += ms_since(t0);
        take_wait_error();  // the batch's own error says more
        throw;
    }
    counters_.drain_ms += ms_since(t0);
    add_batch_counters(*batch);
    const std::string gave_up = take_wait_error();
    if (!gave_up.empty()) {  // a compute thread stopped the graph on the deadline; the reads came later
        throw Error(gave_up);
    }
}

void Streamer::clear_failure() {
    std::lock_guard<std::mutex> lock(wait_mutex_);
    fatal_.store(false, std::memory_order_release);
    wait_error_.clear();
}

void Streamer::mark_ready(size_t tensor, int expert, uint64_t generation) {
    ready_[tensor][static_cast<size_t>(expert)].store(generation, std::memory_order_release);
    { std::lock_guard<std::mutex> lock(wait_mutex_); }  // no waiter can miss the store below
    wait_cv_.notify_all();
}

void Streamer::mark_failed() {
    {
        std::lock_guard<std::mutex> lock(wait_mutex_);
        fatal_.store(true, std::memory_order_release);
    }
    wait_cv_.notify_all();
}

void Streamer::wait_ready(const void * key, int expert) {
    const auto it = std::lower_bound(by_key_.begin(), by_key_.end(), std::make_pair(key, size_t{0}));
    if (it == by_key_.end() || it->first != key) {
        return;
    }
    const size_t t = it->second;
    if (expert < 0 || expert >= tensors_[t].n_expert) {  // the router checked; never index past the flags
        mark_failed();
        return;
    }
    if (whole_graph_.load(std::memory_order_relaxed)) {  // resident, all of them: only the use is noted
        used_.mark(tensors_[t].layer, expert);
        return;
    }
    const uint64_t want = wanted_[t].load(std::memory_order_acquire);
    std::atomic<uint64_t> & flag = ready_[t][static_cast<size_t>(expert)];
    auto ready = [&] { return flag.load(std::memory_order_acquire) == want || fatal_.load(std::memory_order_acquire); };
    if (ready()) {
        return;
    }
    const auto t0 = Clock::now();
    while (!ready() && Clock::now() - t0 < kSpinFor) {
        std::this_thread::yield();
    }
    if (!ready()) {
        std::unique_lock<std::mutex> lock(wait_mutex_);
        if (io_timeout_s_ <= 0) {
            wait_cv_.wait(lock, ready);
        } else if (!wait_cv_.wait_for(lock, std::chrono::duration<double>(io_timeout_s_), ready)) {
            // Stop the graph (the abort callback sees the flag); drain() says why.
            if (wait_error_.empty()) {
                wait_error_ = tensors_[t].name + " expert " + std::to_string(expert) +
                              " was not read within the I/O deadline (--io-timeout): the storage is not answering";
            }
            fatal_.store(true, std::memory_order_release);
            lock.unlock();
            wait_cv_.notify_all();
        }
    }
    stall_ns_ += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

bool Streamer::holds_every_expert() const {
    if (in_flight_ || ahead_batch_ || settle_batch_ || !abandoned_.empty()) {
        return false;
    }
    size_t all = 0;  // an inactive layer (an MTP head given up on) holds nothing and is not computed
    for (int layer = 0; layer < n_layers(); ++layer) {
        const std::vector<size_t> & projections = by_layer_[static_cast<size_t>(layer)];
        if (!projections.empty() && cache_.active(layer)) {
            all += static_cast<size_t>(tensors_[projections.front()].n_expert);
        }
    }
    return all > 0 && cache_.size() == all;
}

void Streamer::begin_whole_graph() {
    if (!used_.sized()) {
        std::vector<int> n_expert;
        for (const std::vector<size_t> & projections : by_layer_) {
            n_expert.push_back(projections.empty() ? 0 : tensors_[projections.front()].n_expert);
        }
        used_.resize(n_expert);
    }
    used_.begin();
    whole_graph_.store(true, std::memory_order_release);
}

// What admit() does for a layer whose experts are all cached: a lookup that hits per distinct expert (its use
// counted once: a batch's tokens per expert are not known here), the layer's visit, the routed bytes.
void Streamer::end_whole_graph() {
    whole_graph_.store(false, std::memory_order_release);
    for (int layer = 0; layer < n_layers(); ++layer) {
        const std::vector<int> used = by_layer_[static_cast<size_t>(layer)].empty() ? std::vector<int>()
                                                                                     : used_.used(layer);
        if (used.empty()) {
            continue;  // not computed in this graph (an MTP head's layer runs in its own)
        }
        cache_.visit(layer);
        for (const int e : used) {
            ++counters_.lookups;
            counters_.hits += cache_.touch({layer, e}) ? 1 : 0;
            if (routed_.insert((static_cast<uint64_t>(layer) << 32) | static_cast<uint32_t>(e)).second) {
                counters_.routed_bytes += bytes_per_expert(layer);
            }
        }
    }
}

}  // namespace bmoe::detail
