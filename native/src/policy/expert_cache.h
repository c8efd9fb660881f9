// The cache policy: which experts stay resident between uses, under a byte budget. Pure
// bookkeeping: it decides what stays and what goes; the streamer does the reading and releasing.
//
// Every token visits the layers in the same order, so one LRU over all layers sees a loop: with a
// budget below one token's routed experts, everything is evicted just before it is needed again
// and the hit rate is 0% (measured: 0 hits and slower than no cache). The budget is therefore
// split into per-layer shares (the same number of experts in every layer; the rest of the budget,
// less than one expert of every layer, one more expert for the first layers it pays for), and a
// layer evicts only its own entries. A budget below one expert per layer keeps nothing (it could
// never hit).
//
// Inside a layer the victim is the expert with the lowest aged use count (Ranking::Frequency): each
// visit of the layer halves-in-32-visits every count and adds, per routed expert, the number of the
// batch's tokens that routed to it (a prompt's batch: of its sequences, Streamer::count_uses_per_sequence);
// ties go least recent first. A --parallel step routes to the union
// of several sequences' experts (~22 of 64 a layer for 4 sequences on skewed routing), more than a
// share at a 40% cap (12): under LRU the step's own order decided what stayed (its highest ids), and
// the cache kept little that the next step reused. Counts keep the experts every sequence comes back
// to. Replayed on real traces (bench-data/2026-12-02/batching-cache/, `bench cache-sim`): 17%
// fewer bytes read for 4 skewed sequences, 10% fewer for one, 2% fewer on uniform routing; LRU, 2Q, ARC
// and "admit on second use" all read more. Ranking::Lru (equal shares, least recent first) is the
// cache before it, for A/B measurements only (BMOE_CACHE_POLICY=lru).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <vector>

namespace bmoe::detail {

struct ExpertKey {
    int layer = 0;
    int expert = 0;
    bool operator==(const ExpertKey & o) const { return layer == o.layer && expert == o.expert; }
};

enum class Ranking { Frequency, Lru };

class ExpertCache {
public:
    // Per layer: the bytes of one of its experts (all projections) and its expert count; a layer
    // with 0 bytes has no streamed experts.
    ExpertCache(uint64_t budget_bytes, std::vector<uint64_t> expert_bytes, std::vector<int> n_expert,
                Ranking ranking = Ranking::Frequency);
    // BMOE_CACHE_POLICY=lru: the LRU cache before issue 30, for A/B runs; anything else: Frequency.
    static Ranking ranking_from_env();

    // Before a layer's lookups: its use counts age by one visit.
    void visit(int layer);
    // True (and the entry becomes the most recent of its layer) if the expert is resident; `uses`
    // (the batch's tokens that routed to it) count for it either way.
    bool touch(const ExpertKey & key, int uses = 1);
    // True if the expert is resident; the order is left alone (a guess is not a use).
    bool contains(const ExpertKey & key) const;
    // The layer's resident experts, most recent first.
    std::vector<int> resident(int layer) const;
    // Resident from now on, the most recent of its layer (its uses were counted by touch).
    void insert(const ExpertKey & key);
    // Entries to evict so that every layer is within its share again, least recent first; entries
    // of `pinned_layer` (the layer being computed) are never chosen. They leave the cache.
    std::vector<ExpertKey> evict_over_budget(int pinned_layer);
    // Forget these entries of one layer (their reads failed: they are not resident).
    void evict_layer(int layer, const std::vector<int> & experts);
    // A new budget (memory pressure came or went); evict_over_budget applies a smaller one.
    void set_budget(uint64_t budget_bytes);
    // A layer that is not going to run for a while (an MTP head whose drafts stopped) gives its share
    // back: its entries leave (returned, to be released) and every other layer's share grows by its
    // part of the slot. Reversible; a layer is active from the start.
    std::vector<ExpertKey> set_active(int layer, bool active);
    bool active(int layer) const { return !inactive_[static_cast<size_t>(layer)]; }

    uint64_t budget() const { return budget_; }
    // Experts every layer may keep beyond the one being computed (0: the cache is off); share(layer)
    // is the layer's own, with the budget's rest.
    int per_layer() const { return per_layer_; }
    int share(int layer) const { return shares_[static_cast<size_t>(layer)]; }
    Ranking ranking() const { return ranking_; }
    // The bytes one expert of every layer takes: the smallest budget that can hit.
    uint64_t bytes_per_token_slot() const { return slot_bytes_; }
    uint64_t resident_bytes() const { return bytes_; }
    size_t size() const { return entries_; }

private:
    struct Layer {
        std::list<int> lru;  // front = most recent
        std::vector<std::list<int>::iterator> where;
        std::vector<bool> present;
        std::vector<double> uses;  // aged use counts of every expert, resident or not
    };
    void drop(int layer, std::list<int>::iterator it);
    std::list<int>::iterator victim(Layer & l);

    uint64_t budget_ = 0;
    std::vector<uint64_t> expert_bytes_;
    uint64_t slot_bytes_ = 0;
    int per_layer_ = 0;
    std::vector<int> shares_;
    Ranking ranking_ = Ranking::Frequency;
    std::vector<Layer> layers_;
    std::vector<bool> inactive_;
    uint64_t bytes_ = 0;
    size_t entries_ = 0;
};

}  // namespace bmoe::detail
