#include "expert_cache.h"

namespace bmoe::detail {

bool ExpertCache::touch(const ExpertKey & key) {
    const auto it = index_.find(hash(key));
    if (it == index_.end()) {
        return false;
    }
    lru_.splice(lru_.begin(), lru_, it->second);
    return true;
}

void ExpertCache::insert(const ExpertKey & key, uint64_t bytes) {
    lru_.push_front({key, bytes});
    index_[hash(key)] = lru_.begin();
    bytes_ += bytes;
}

std::vector<ExpertKey> ExpertCache::evict_over_budget(int pinned_layer) {
    std::vector<ExpertKey> victims;
    auto it = lru_.end();
    while (bytes_ > budget_ && it != lru_.begin()) {
        --it;
        if (it->key.layer == pinned_layer) {
            continue;
        }
        victims.push_back(it->key);
        bytes_ -= it->bytes;
        index_.erase(hash(it->key));
        it = lru_.erase(it);
    }
    return victims;
}

void ExpertCache::evict_layer(int layer, const std::vector<int> & experts) {
    for (int e : experts) {
        const auto it = index_.find(hash({layer, e}));
        if (it != index_.end()) {
            bytes_ -= it->second->bytes;
            lru_.erase(it->second);
            index_.erase(it);
        }
    }
}

}  // namespace bmoe::detail
