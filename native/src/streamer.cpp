#include "streamer.h"

#include <algorithm>
#include <chrono>

#include "mirror.h"
#include "read_lanes.h"
#include "slice_file.h"

namespace bmoe::detail {

Streamer::Streamer(std::vector<StreamedTensor> tensors, std::vector<SliceFile *> files, std::vector<Mirror *> mirrors,
                   uint64_t cache_budget_bytes, ReadLanes & lanes)
    : tensors_(std::move(tensors)), files_(std::move(files)), mirrors_(std::move(mirrors)),
      cache_(cache_budget_bytes), lanes_(lanes) {
    int max_layer = -1;
    for (const auto & t : tensors_) {
        max_layer = std::max(max_layer, t.layer);
    }
    by_layer_.resize(static_cast<size_t>(max_layer + 1));
    for (size_t i = 0; i < tensors_.size(); ++i) {
        by_layer_[static_cast<size_t>(tensors_[i].layer)].push_back(i);
    }
    for (auto & idx : by_layer_) {
        std::sort(idx.begin(), idx.end(),
                  [&](size_t a, size_t b) { return tensors_[a].projection < tensors_[b].projection; });
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
    for (size_t i : by_layer_[static_cast<size_t>(layer)]) {
        const StreamedTensor & t = tensors_[i];
        const uint64_t off = t.offset + static_cast<uint64_t>(expert) * t.expert_bytes;
        if (acquire) {
            mirrors_[t.file]->acquire(off, t.expert_bytes);
        } else {
            mirrors_[t.file]->release(off, t.expert_bytes);
        }
    }
}

void Streamer::make_resident(int layer, const std::vector<int> & routed) {
    if (layer < 0 || layer >= n_layers() || by_layer_[static_cast<size_t>(layer)].empty()) {
        return;  // a layer without streamed experts (dense layers of a mixed model)
    }
    std::vector<int> experts(routed);
    std::sort(experts.begin(), experts.end());
    experts.erase(std::unique(experts.begin(), experts.end()), experts.end());

    std::vector<int> missing;
    for (int e : experts) {
        ++counters_.lookups;
        if (cache_.touch({layer, e})) {
            ++counters_.hits;
        } else {
            missing.push_back(e);
        }
    }
    // Count the new slices in before evicting, so a page shared with a victim is not dropped
    // only to be read again.
    for (int e : missing) {
        for_each_slice(layer, e, true);
        cache_.insert({layer, e}, bytes_per_expert(layer));
    }
    for (const ExpertKey & victim : cache_.evict_over_budget(layer)) {
        for_each_slice(victim.layer, victim.expert, false);
        ++counters_.evictions;
    }
    if (missing.empty()) {
        return;
    }
    // Projection-major, experts ascending: the order the expert matmuls consume them.
    std::vector<ReadJob> jobs;
    jobs.reserve(missing.size() * by_layer_[static_cast<size_t>(layer)].size());
    for (size_t i : by_layer_[static_cast<size_t>(layer)]) {
        const StreamedTensor & t = tensors_[i];
        for (int e : missing) {
            jobs.push_back({files_[t.file], t.offset + static_cast<uint64_t>(e) * t.expert_bytes, t.expert_bytes});
            counters_.slice_bytes += t.expert_bytes;
        }
    }
    auto batch = std::make_shared<Batch>(std::move(jobs));
    const auto t0 = std::chrono::steady_clock::now();
    lanes_.submit(batch);
    try {
        batch->wait();
    } catch (...) {
        // The failed layer's slices must never count as resident.
        for (int e : missing) {
            for_each_slice(layer, e, false);
        }
        cache_.evict_layer(layer, missing);
        throw;
    }
    counters_.stall_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    counters_.io_ms += batch->io_ms();
    counters_.storage_bytes += batch->storage_bytes();
    counters_.copy_bytes += batch->copy_bytes();
}

StreamCounters Streamer::take_counters() {
    StreamCounters out = counters_;
    counters_ = StreamCounters{};
    return out;
}

uint64_t Streamer::resident_expert_bytes() const {
    uint64_t total = 0;
    for (const Mirror * m : mirrors_) {
        total += m->resident_bytes();
    }
    return total;
}

}  // namespace bmoe::detail
