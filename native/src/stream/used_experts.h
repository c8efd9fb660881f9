// The experts a graph used while it ran whole (streamer.h: every streamed expert resident, no layer's router
// observed): the expert-ready hook marks each (layer, expert) it is called for, from every compute thread at once,
// and after the graph used() lists a layer's marked experts. A mark is the graph's stamp: nothing is cleared
// between graphs.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

namespace bmoe::detail {

class UsedExperts {
public:
    bool sized() const { return !sizes_.empty(); }
    // Experts per layer (0: a layer without streamed experts).
    void resize(const std::vector<int> & n_expert) {
        sizes_ = n_expert;
        marks_.clear();
        for (int n : n_expert) {
            marks_.emplace_back(new std::atomic<uint32_t>[static_cast<size_t>(n)]());
        }
        stamp_ = 0;
    }
    // A new graph, before it starts (the thread pool's start orders this before the hook's reads of the stamp).
    void begin() {
        if (++stamp_ == 0) {  // wrapped: a mark of 2^32 graphs ago would count again
            resize(std::vector<int>(sizes_));
            stamp_ = 1;
        }
    }
    void mark(int layer, int expert) {
        std::atomic<uint32_t> & m = marks_[static_cast<size_t>(layer)][static_cast<size_t>(expert)];
        if (m.load(std::memory_order_relaxed) != stamp_) {
            m.store(stamp_, std::memory_order_relaxed);
        }
    }
    // The experts of `layer` marked since begin(), ascending (after the graph: its threads have joined).
    std::vector<int> used(int layer) const {
        std::vector<int> out;
        for (int e = 0; e < sizes_[static_cast<size_t>(layer)]; ++e) {
            if (marks_[static_cast<size_t>(layer)][static_cast<size_t>(e)].load(std::memory_order_relaxed) == stamp_) {
                out.push_back(e);
            }
        }
        return out;
    }

private:
    std::vector<int> sizes_;
    std::vector<std::unique_ptr<std::atomic<uint32_t>[]>> marks_;
    uint32_t stamp_ = 0;
};

}  // namespace bmoe::detail
