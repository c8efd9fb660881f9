#include "stream/streamer.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

#include "bmoe/error.h"
#include "read/mirror.h"
#include "read/page_pool.h"
#include "read/read_lanes.h"
#include "read/slice_file.h"

namespace bmoe::detail {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int layer_count(const std::vector<StreamedTensor> & tensors) {
    int n = 0;
    for (const auto & t : tensors) {
        n = std::max(n, t.layer + 1);
    }
    return n;
}

std::vector<uint64_t> expert_bytes_by_layer(const std::vector<StreamedTensor> & tensors) {
    std::vector<uint64_t> out(static_cast<size_t>(layer_count(tensors)), 0);
    for (const auto & t : tensors) {
        out[static_cast<size_t>(t.layer)] += t.expert_bytes;
    }
    return out;
}

std::vector<int> experts_by_layer(const std::vector<StreamedTensor> & tensors) {
    std::vector<int> out(static_cast<size_t>(layer_count(tensors)), 0);
    for (const auto & t : tensors) {
        out[static_cast<size_t>(t.layer)] = std::max(out[static_cast<size_t>(t.layer)], t.n_expert);
    }
    return out;
}

}  // namespace

Streamer::Streamer(std::vector<StreamedTensor> tensors, std::vector<SliceFile *> files, std::vector<Mirror *> mirrors,
                   PagePool & pool, ReadLanes & lanes, int compute_threads, double io_timeout_s)
    : tensors_(std::move(tensors)), files_(std::move(files)), mirrors_(std::move(mirrors)), pool_(pool),
      cache_(0, expert_bytes_by_layer(tensors_), experts_by_layer(tensors_), ExpertCache::ranking_from_env()),
      lanes_(lanes),
      compute_threads_(std::max(1, compute_threads)), io_timeout_s_(io_timeout_s) {
    int max_layer = -1;
    for (const auto & t : tensors_) {
        max_layer = std::max(max_layer, t.layer);
    }
    by_layer_.resize(static_cast<size_t>(max_layer + 1));
    for (size_t i = 0; i < tensors_.size(); ++i) {
        by_layer_[static_cast<size_t>(tensors_[i].layer)].push_back(i);
        by_key_.emplace_back(tensors_[i].key, i);
        ready_.emplace_back(new std::atomic<uint64_t>[static_cast<size_t>(tensors_[i].n_expert)]);
        for (int e = 0; e < tensors_[i].n_expert; ++e) {
            ready_.back()[static_cast<size_t>(e)].store(0, std::memory_order_relaxed);
        }
    }
    wanted_.reset(new std::atomic<uint64_t>[tensors_.size()]);
    for (size_t i = 0; i < tensors_.size(); ++i) {
        wanted_[i].store(0, std::memory_order_relaxed);
    }
    std::sort(by_key_.begin(), by_key_.end());
    for (auto & idx : by_layer_) {
        std::sort(idx.begin(), idx.end(),
                  [&](size_t a, size_t b) { return tensors_[a].projection < tensors_[b].projection; });
    }
}

Streamer::~Streamer() {
    // Never free the mirror under a lane still writing into it (an abandoned batch's stuck read
    // included: closing waits for the kernel to return it).
    std::vector<std::shared_ptr<Batch>> left;
    for (auto & a : abandoned_) {
        left.push_back(std::move(a.batch));
    }
    if (in_flight_) {
        left.push_back(std::move(in_flight_));
    }
    for (auto * ahead : {&ahead_batch_, &settle_batch_}) {
        if (*ahead) {
            (*ahead)->cancel_queued();
            left.push_back(std::move(*ahead));
        }
    }
    for (const auto & batch : left) {
        try {
            batch->wait();
        } catch (...) {
        }
    }
}

uint64_t Streamer::bytes_per_expert(int layer) const {
    uint64_t total = 0;
    if (layer >= 0 && layer < n_layers()) {
        for (size_t i : by_layer_[static_cast<size_t>(layer)]) {
            total += tensors_[i].expert_bytes;
        }
    }
    return total;
}

void Streamer::for_each_slice(int layer, int expert, bool acquire) {
    const std::vector<size_t> & projections = by_layer_[static_cast<size_t>(layer)];
    for (size_t k = 0; k < projections.size(); ++k) {
        const StreamedTensor & t = tensors_[projections[k]];
        const uint64_t off = t.offset + static_cast<uint64_t>(expert) * t.expert_bytes;
        if (!acquire) {
            mirrors_[t.file]->release(off, t.expert_bytes);
            continue;
        }
        try {
            mirrors_[t.file]->acquire(off, t.expert_bytes);
        } catch (...) {
            for (size_t j = 0; j < k; ++j) {  // all of an expert's projections, or none
                const StreamedTensor & done = tensors_[projections[j]];
                mirrors_[done.file]->release(done.offset + static_cast<uint64_t>(expert) * done.expert_bytes,
                                             done.expert_bytes);
            }
            throw;
        }
    }
}

void Streamer::release_victims(const std::vector<ExpertKey> & victims) {
    for (const ExpertKey & victim : victims) {
        for_each_slice(victim.layer, victim.expert, false);
        ++counters_.evictions;
    }
}

std::vector<int> Streamer::admit(int layer, const std::vector<int> & routed, std::vector<int> & experts,
                                 std::vector<int> & adopted) {
    experts = routed;
    std::sort(experts.begin(), experts.end());
    // How many of the batch's tokens routed to each: the cache counts an expert several sequences share
    // for each of them.
    std::vector<int> uses;
    for (size_t i = 0; i < experts.size(); ++i) {
        if (i == 0 || experts[i] != experts[i - 1]) {
            uses.push_back(0);
        }
        ++uses.back();
    }
    experts.erase(std::unique(experts.begin(), experts.end()), experts.end());
    const int n_expert = tensors_[by_layer_[static_cast<size_t>(layer)].front()].n_expert;
    if (!experts.empty() && (experts.front() < 0 || experts.back() >= n_expert)) {
        throw Error("layer " + std::to_string(layer) + " routed to expert " +
                    std::to_string(experts.front() < 0 ? experts.front() : experts.back()) + " of " +
                    std::to_string(n_expert) + ": the router's output is corrupt");
    }
    if (ahead_layer_ >= 0 && ahead_layer_ != layer) {
        retire_ahead();  // guesses for a layer the router never reached
    }
    std::vector<int> missing;
    adopted.clear();
    cache_.visit(layer);
    for (size_t i = 0; i < experts.size(); ++i) {
        const int e = experts[i];
        ++counters_.lookups;
        if (routed_.insert((static_cast<uint64_t>(layer) << 32) | static_cast<uint32_t>(e)).second) {
            counters_.routed_bytes += bytes_per_expert(layer);
        }
        if (cache_.touch({layer, e}, std::min(uses[i], uses_cap_))) {
            ++counters_.hits;
        } else if (staged(layer, e)) {
            adopted.push_back(e);  // mapped and read (or reading) ahead: it holds its slices already
            cache_.insert({layer, e});
        } else {
            missing.push_back(e);
        }
    }
    // Count the new slices in before evicting, so a page shared with a victim is not dropped
    // only to be read again.
    for (size_t i = 0; i < missing.size(); ++i) {
        try {
            for_each_slice(layer, missing[i], true);
        } catch (...) {
            // A mapping failed: nothing of this layer may count as resident.
            for (size_t j = 0; j < i; ++j) {
                for_each_slice(layer, missing[j], false);
            }
            cache_.evict_layer(layer, std::vector<int>(missing.begin(), missing.begin() + static_cast<long>(i)));
            cache_.evict_layer(layer, adopted);  // their slices stay the read-ahead's, released once by it
            throw;
        }
        cache_.insert({layer, missing[i]});
    }
    release_victims(cache_.evict_over_budget(layer));
    return missing;
}

void Streamer::set_layouts(std::vector<std::shared_ptr<const SliceLayout>> layouts) {
    bool cached = false;
    for (int l = 0; l < n_layers(); ++l) {
        cached = cached || !cached_experts(l).empty();
    }
    if (layouts.size() != tensors_.size() || cached || in_flight_ || ahead_batch_) {
        throw Error("layouts for " + std::to_string(layouts.size()) + " of " + std::to_string(tensors_.size()) +
                    " streamed tensors, or with slices resident or in flight");
    }
    for (size_t i = 0; i < layouts.size(); ++i) {
        tensors_[i].layout = std::move(layouts[i]);
    }
}

std::vector<ReadJob> Streamer::jobs_for(int layer, const std::vector<int> & missing,
                                        std::vector<std::pair<size_t, int>> * targets, std::vector<size_t> * firsts) {
    // Projection-major, experts ascending: the order the expert matmuls consume them. A prompt's batch misses
    // nearly every expert of a layer: one job per slice there made each lane wake ~200 times a layer, and
    // with the prompt computing on every core each wake waited for one (its reads took 2x as long at the Pi 5
    // Gen 2 class, bench-data/2026-12-02/long-prompt-2). Adjacent slices are adjacent in the file and in
    // the mirror: one read fills them (not when each slice is checked against its own checksum).
    const auto & mine = by_layer_[static_cast<size_t>(layer)];
    const bool merge = firsts != nullptr && !mine.empty() &&
                       2 * missing.size() >= static_cast<size_t>(tensors_[mine.front()].n_expert);
    std::vector<ReadJob> jobs;
    size_t n_targets = 0;
    for (size_t i : mine) {
        const StreamedTensor & t = tensors_[i];
        for (size_t k = 0; k < missing.size(); ++k) {
            const int e = missing[k];
            const uint64_t offset = t.offset + static_cast<uint64_t>(e) * t.expert_bytes;
            const bool extend = merge && t.sums.empty() && k > 0 && missing[k - 1] == e - 1 &&
                                jobs.back().offset + jobs.back().length == offset &&
                                jobs.back().length + t.expert_bytes <= kMergeBytes;
            if (extend) {
                jobs.back().length += t.expert_bytes;
            } else {
                jobs.push_back({files_[t.file], offset, t.expert_bytes});
                jobs.back().layout = t.layout.get();
                if (firsts != nullptr) {
                    firsts->push_back(n_targets);
                }
            }
            if (!t.sums.empty()) {
                jobs.back().verify = true;
                jobs.back().crc32c = t.sums[static_cast<size_t>(e)];
                jobs.back().what = t.name + " expert " + std::to_string(e);
            }
            if (targets != nullptr) {
                targets->emplace_back(i, e);
            }
            ++n_targets;
        }
    }
    if (firsts != nullptr) {
        firsts->push_back(n_targets);
    }
    return jobs;
}

void Streamer::forget(int layer, const std::vector<int> & missing) {
    // A failed layer's slices must never count as resident.
    for (int e : missing) {
        for_each_slice(layer, e, false);
    }
    cache_.evict_layer(layer, missing);
}

void Streamer::add_batch_counters(const Batch & batch) {
    timeouts_in_a_row_ = 0;  // a batch that landed: the storage answers again
    counters_.io_ms += batch.io_ms();
    counters_.storage_bytes += batch.storage_bytes();
    counters_.copy_bytes += batch.copy_bytes();
    counters_.convert_ms += batch.convert_ms();
    counters_.rereads += batch.rereads();
}

void Streamer::make_resident(int layer, const std::vector<int> & routed) {
    if (layer < 0 || layer >= n_layers() || by_layer_[static_cast<size_t>(layer)].empty()) {
        return;  // a layer without streamed experts (the dense layers of a mixed model)
    }
    reap_abandoned();
    std::vector<int> experts;
    std::vector<int> adopted;
    const std::vector<int> missing = admit(layer, routed, experts, adopted);
    adopt_ahead(layer, experts, adopted, 0);
    const auto t0 = Clock::now();
    if (!missing.empty()) {
        std::vector<size_t> firsts;
        auto batch = std::make_shared<Batch>(jobs_for(layer, missing, nullptr, &firsts));
        counters_.slice_bytes += static_cast<uint64_t>(missing.size()) * bytes_per_expert(layer);
        lanes_.submit(batch);
        try {
            batch->wait(io_timeout_s_);
        } catch (...) {
            give_up(batch, layer, missing);
            throw;
        }
        add_batch_counters(*batch);
    }
    settle_ahead();  // the adopted guesses must have landed too
    counters_.stall_ms += ms_since(t0);
}

void Streamer::publish(int layer, const std::vector<int> & routed) {
    drain();  // eviction below must not release pages a lane is still writing
    fatal_.store(false, std::memory_order_release);
    if (layer < 0 || layer >= n_layers() || by_layer_[static_cast<size_t>(layer)].empty()) {
        return;
    }
    reap_abandoned();
    std::vector<int> experts;
    std::vector<int> adopted;
    const std::vector<int> missing = admit(layer, routed, experts, adopted);
    const uint64_t generation = ++generation_;
    for (size_t i : by_layer_[static_cast<size_t>(layer)]) {
        wanted_[i].store(generation, std::memory_order_release);
        for (int e : experts) {
            if (!std::binary_search(missing.begin(), missing.end(), e) &&
                !std::binary_search(adopted.begin(), adopted.end(), e)) {
                ready_[i][static_cast<size_t>(e)].store(generation, std::memory_order_release);  // a cache hit
            }
        }
    }
    adopt_ahead(layer, experts, adopted, generation);
    if (missing.empty()) {
        return;
    }
    counters_.slice_bytes += static_cast<uint64_t>(missing.size()) * bytes_per_expert(layer);
    auto targets = std::make_shared<std::vector<std::pair<size_t, int>>>();
    auto firsts = std::make_shared<std::vector<size_t>>();
    std::vector<ReadJob> jobs = jobs_for(layer, missing, targets.get(), firsts.get());
    in_flight_ = std::make_shared<Batch>(std::move(jobs), [this, targets, firsts, generation](size_t index, bool ok) {
        if (ok) {
            for (size_t j = (*firsts)[index]; j < (*firsts)[index + 1]; ++j) {
                mark_ready((*targets)[j].first, (*targets)[j].second, generation);
            }
        } else {
            mark_failed();
        }
    });
    in_flight_layer_ = layer;
    in_flight_missing_ = missing;
    lanes_.submit(in_flight_);
}

}  // namespace bmoe::detail
