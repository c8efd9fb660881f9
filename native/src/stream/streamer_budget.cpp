// The streamer's memory (streamer.h): the cache's budget as MemoryBudget moves it, the page pool's warm and
// spare units, a layer's share on and off, and the counters a step takes. Split from streamer.cpp.
#include "stream/streamer.h"

#include <algorithm>

#include "read/mirror.h"
#include "read/page_pool.h"

namespace bmoe::detail {

void Streamer::set_budget(uint64_t bytes) {
    const bool shrinking = bytes < cache_.budget();
    if (bytes != cache_.budget()) {
        gave_back_ = shrinking;
    }
    cache_.set_budget(bytes);
    release_victims(cache_.evict_over_budget(-1));
    if (shrinking) {
        trim_to_budget();  // the evicted experts' pages go back to the kernel, not to the pool
    }
}

void Streamer::settle() {
    release_victims(cache_.evict_over_budget(-1));
    trim_to_budget();
}

void Streamer::trim_to_budget() {
    // Down to the budget, not to nothing: free units the budget has room for are the pages the next reads
    // fill. Trimming every free unit made each prompt populate its pool again (the units' pages are zeroed
    // by the kernel on the eval thread, with the compute threads waiting), and a budget moved for a
    // prompt's compute buffer gave up pages the same prompt then faulted in again.
    pool_.trim(std::max(cache_.budget() / pool_.unit(), pool_.units_in_use()));
}

uint64_t Streamer::warm_pool(uint64_t max_bytes, uint64_t all_experts_bytes) {
    // The pool spans the mirrors, dense ranges included: never more than every expert's slices, whatever
    // the budget (an uncapped run's budget is the machine's memory).
    const uint64_t target = std::min(cache_.budget(), all_experts_bytes) / pool_.unit();
    return pool_.reserve(target, std::max<uint64_t>(1, max_bytes / pool_.unit())) * pool_.unit();
}

void Streamer::trim_spare() {
    // Only while memory is given back: trimming in a steady state costs ~30% of decode speed (the units come back
    // populated with small pages), and without a neighbour the spare pages are the next reads' pages.
    if (!gave_back_) {
        return;
    }
    const uint64_t held = pool_.held_units() * pool_.unit();
    const uint64_t in_use = pool_.units_in_use() * pool_.unit();
    if (held > std::max(cache_.budget(), in_use) + kSpareSlackBytes) {
        trim_to_budget();
    }
}

void Streamer::set_layer_active(int layer, bool active) { release_victims(cache_.set_active(layer, active)); }

uint64_t Streamer::pool_held_bytes() const { return pool_.held_units() * pool_.unit(); }

StreamCounters Streamer::take_counters() {
    StreamCounters out = counters_;
    out.stall_ms += static_cast<double>(stall_ns_.exchange(0)) / 1e6 / compute_threads_;
    counters_ = StreamCounters{};
    routed_.clear();
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
