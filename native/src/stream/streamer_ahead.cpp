// The streamer's read-ahead: guesses for the next layer are mapped and read at background
// priority, adopted by the layer when its router confirms them, and released when it does not.
// Lossless by construction: a guess never becomes part of what is computed unless the router
// chose that expert, and an adopted slice is waited for exactly like a slice read on demand.
#include <algorithm>

#include "bmoe/error.h"
#include "read/mirror.h"
#include "read/read_lanes.h"
#include "stream/streamer.h"

namespace bmoe::detail {

bool Streamer::staged(int layer, int expert) const {
    return layer == ahead_layer_ && std::binary_search(ahead_staged_.begin(), ahead_staged_.end(), expert);
}

void Streamer::prefetch(int layer, const std::vector<int> & predicted) {
    if (ahead_layer_ >= 0) {
        retire_ahead();
    }
    if (layer < 0 || layer >= n_layers() || by_layer_[static_cast<size_t>(layer)].empty()) {
        return;
    }
    const int n_expert = tensors_[by_layer_[static_cast<size_t>(layer)].front()].n_expert;
    ahead_predicted_.clear();
    for (int e : predicted) {
        if (e >= 0 && e < n_expert) {
            ahead_predicted_.push_back(e);
        }
    }
    std::sort(ahead_predicted_.begin(), ahead_predicted_.end());
    ahead_predicted_.erase(std::unique(ahead_predicted_.begin(), ahead_predicted_.end()), ahead_predicted_.end());
    ahead_layer_ = layer;
    ahead_staged_.clear();
    for (int e : ahead_predicted_) {
        if (cache_.contains({layer, e})) {
            continue;
        }
        try {
            for_each_slice(layer, e, true);
        } catch (const std::exception &) {
            break;  // no memory to map a guess: read ahead less, never fail the decode for it
        }
        ahead_staged_.push_back(e);
    }
    guess_layer_ = layer;
    guess_uncached_ = ahead_staged_;
    if (ahead_staged_.empty()) {
        return;
    }
    ahead_ = std::make_shared<ReadAhead>();
    std::vector<ReadJob> jobs = jobs_for(layer, ahead_staged_, &ahead_->targets);
    ahead_->landed.assign(jobs.size(), 0);
    ahead_->adopted.assign(jobs.size(), 0);
    ahead_batch_ = std::make_shared<Batch>(std::move(jobs), [this, state = ahead_](size_t index, bool ok) {
        uint64_t generation = 0;
        {
            std::lock_guard<std::mutex> lock(state->mutex);
            state->landed[index] = ok ? 1 : 2;
            generation = state->adopted[index];
        }
        if (generation == 0) {
            return;  // not (yet) routed to: adopt_ahead looks at `landed`
        }
        if (ok) {
            mark_ready(state->targets[index].first, state->targets[index].second, generation);
        } else {
            mark_failed();
        }
    });
    lanes_.submit(ahead_batch_, ReadPriority::Background);
}

void Streamer::count_guess(int layer, const std::vector<int> & predicted) {
    guess_layer_ = -1;
    guess_uncached_.clear();
    if (layer < 0 || layer >= n_layers() || by_layer_[static_cast<size_t>(layer)].empty()) {
        return;
    }
    const int n_expert = tensors_[by_layer_[static_cast<size_t>(layer)].front()].n_expert;
    for (int e : predicted) {
        if (e >= 0 && e < n_expert && !cache_.contains({layer, e})) {
            guess_uncached_.push_back(e);
        }
    }
    std::sort(guess_uncached_.begin(), guess_uncached_.end());
    guess_uncached_.erase(std::unique(guess_uncached_.begin(), guess_uncached_.end()), guess_uncached_.end());
    guess_layer_ = layer;
}

void Streamer::adopt_ahead(int layer, const std::vector<int> & experts, const std::vector<int> & adopted,
                           uint64_t generation) {
    if (guess_layer_ == layer) {
        const uint64_t bytes = bytes_per_expert(layer);
        for (int e : guess_uncached_) {
            counters_.guessed_bytes += bytes;
            counters_.guessed_wasted_bytes += std::binary_search(experts.begin(), experts.end(), e) ? 0 : bytes;
        }
    }
    guess_layer_ = -1;
    guess_uncached_.clear();
    if (ahead_layer_ != layer) {
        return;
    }
    counters_.predicted += ahead_predicted_.size();
    for (int e : ahead_predicted_) {
        counters_.predicted_correct += std::binary_search(experts.begin(), experts.end(), e) ? 1 : 0;
    }
    settle_layer_ = layer;
    settle_adopted_ = adopted;
    settle_wrong_.clear();
    std::set_difference(ahead_staged_.begin(), ahead_staged_.end(), adopted.begin(), adopted.end(),
                        std::back_inserter(settle_wrong_));
    settle_batch_ = std::move(ahead_batch_);
    settle_ = std::move(ahead_);
    ahead_layer_ = -1;
    ahead_staged_.clear();
    ahead_predicted_.clear();
    if (!settle_batch_) {
        return;
    }
    std::vector<size_t> wrong_jobs;
    bool failed = false;
    {
        std::lock_guard<std::mutex> lock(settle_->mutex);
        for (size_t j = 0; j < settle_->targets.size(); ++j) {
            const auto & [tensor, e] = settle_->targets[j];
            if (!std::binary_search(adopted.begin(), adopted.end(), e)) {
                wrong_jobs.push_back(j);
            } else if (generation != 0 && settle_->landed[j] == 1) {
                mark_ready(tensor, e, generation);
            } else if (generation != 0 && settle_->landed[j] == 0) {
                settle_->adopted[j] = generation;  // the lane marks it ready when it lands
            } else if (settle_->landed[j] == 2) {
                failed = true;
            }
        }
    }
    settle_batch_->cancel_queued(wrong_jobs);
    if (failed && generation != 0) {
        mark_failed();  // the decode stops; drain (settle_ahead) says why
    }
}

void Streamer::settle_ahead() {
    if (settle_layer_ < 0) {
        return;
    }
    const int layer = settle_layer_;
    settle_layer_ = -1;
    std::shared_ptr<Batch> batch = std::move(settle_batch_);
    std::shared_ptr<ReadAhead> state = std::move(settle_);
    std::vector<int> wrong = std::move(settle_wrong_);
    std::vector<int> adopted = std::move(settle_adopted_);
    if (!batch) {
        return;
    }
    try {
        batch->wait(io_timeout_s_, false);
    } catch (...) {  // the deadline: nothing of it may be recycled until the kernel is done (see give_up)
        cache_.evict_layer(layer, adopted);
        std::vector<int> held = adopted;
        held.insert(held.end(), wrong.begin(), wrong.end());
        abandon(batch, layer, std::move(held));
        throw;
    }
    counters_.storage_bytes += batch->storage_bytes();
    counters_.copy_bytes += batch->copy_bytes();
    counters_.convert_ms += batch->convert_ms();
    counters_.ahead_bytes += batch->storage_bytes();
    std::vector<int> failed;
    for (size_t j = 0; j < state->targets.size(); ++j) {
        const int e = state->targets[j].second;
        const bool was_adopted = std::binary_search(adopted.begin(), adopted.end(), e);
        if (!was_adopted && batch->job_ok(j)) {
            counters_.ahead_wasted_bytes += batch->jobs()[j].length;
        }
        if (was_adopted && !batch->job_ok(j) &&
            std::find(failed.begin(), failed.end(), e) == failed.end()) {
            failed.push_back(e);
        }
    }
    for (int e : wrong) {
        for_each_slice(layer, e, false);
    }
    if (!failed.empty()) {
        std::sort(failed.begin(), failed.end());
        forget(layer, failed);
        batch->wait(0, true);  // rethrows the lane's error: the read that failed and why
        throw Error("a read-ahead of layer " + std::to_string(layer) + " failed");
    }
}

void Streamer::retire_ahead() {
    if (ahead_layer_ < 0) {
        return;
    }
    const int layer = ahead_layer_;
    ahead_layer_ = -1;
    ahead_predicted_.clear();
    std::vector<int> staged = std::move(ahead_staged_);
    ahead_staged_.clear();
    std::shared_ptr<Batch> batch = std::move(ahead_batch_);
    ahead_.reset();
    if (!batch) {
        return;
    }
    batch->cancel_queued();
    try {
        batch->wait(io_timeout_s_, false);
    } catch (...) {
        abandon(batch, layer, std::move(staged));  // a lane may still write into these pages (see give_up)
        return;
    }
    counters_.storage_bytes += batch->storage_bytes();
    counters_.ahead_bytes += batch->storage_bytes();
    counters_.ahead_wasted_bytes += batch->storage_bytes();
    for (int e : staged) {
        for_each_slice(layer, e, false);
    }
}

}  // namespace bmoe::detail
