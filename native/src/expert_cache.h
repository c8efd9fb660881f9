// The cache policy: LRU over (layer, expert) entries under a byte budget. Pure bookkeeping: it
// decides what stays and what goes; the streamer does the reading and the releasing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace bmoe::detail {

struct ExpertKey {
    int layer = 0;
    int expert = 0;
    bool operator==(const ExpertKey & o) const { return layer == o.layer && expert == o.expert; }
};

class ExpertCache {
public:
    explicit ExpertCache(uint64_t budget_bytes) : budget_(budget_bytes) {}

    // True (and the entry becomes most recent) if the expert is resident.
    bool touch(const ExpertKey & key);
    void insert(const ExpertKey & key, uint64_t bytes);
    // Entries to evict, least recent first, so that everything resident fits the budget again;
    // entries of `pinned_layer` (the layer being computed) are never chosen. They are removed
    // from the cache when returned.
    std::vector<ExpertKey> evict_over_budget(int pinned_layer);

    // Forget these entries of one layer (their reads failed: they are not resident).
    void evict_layer(int layer, const std::vector<int> & experts);

    uint64_t resident_bytes() const { return bytes_; }
    uint64_t budget() const { return budget_; }
    size_t size() const { return index_.size(); }

private:
    struct Entry {
        ExpertKey key;
        uint64_t bytes;
    };
    static uint64_t hash(const ExpertKey & k) {
        return (static_cast<uint64_t>(static_cast<uint32_t>(k.layer)) << 32) | static_cast<uint32_t>(k.expert);
    }

    uint64_t budget_;
    uint64_t bytes_ = 0;
    std::list<Entry> lru_;  // front = most recent
    std::unordered_map<uint64_t, std::list<Entry>::iterator> index_;
};

}  // namespace bmoe::detail
