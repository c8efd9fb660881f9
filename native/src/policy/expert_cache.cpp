#include "policy/expert_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace bmoe::detail {

namespace {
// A count loses half its weight in this many visits of its layer: long enough that an expert every
// sequence returns to outranks a burst, short enough that a new topic's experts take over within a
// few dozen tokens (the replays found 8 to 128 within 1% of each other).
constexpr double kHalfLifeVisits = 32.0;
const double kAging = std::exp2(-1.0 / kHalfLifeVisits);
}  // namespace

ExpertCache::ExpertCache(uint64_t budget_bytes, std::vector<uint64_t> expert_bytes, std::vector<int> n_expert,
                         Ranking ranking)
    : expert_bytes_(std::move(expert_bytes)), layers_(expert_bytes_.size()), inactive_(expert_bytes_.size(), false),
      ranking_(ranking) {
    for (size_t l = 0; l < layers_.size(); ++l) {
        const auto n = static_cast<size_t>(l < n_expert.size() ? std::max(0, n_expert[l]) : 0);
        layers_[l].where.resize(n);
        layers_[l].present.assign(n, false);
        layers_[l].uses.assign(n, 0.0);
        slot_bytes_ += expert_bytes_[l];
    }
    set_budget(budget_bytes);
}

Ranking ExpertCache::ranking_from_env() {
    const char * v = std::getenv("BMOE_CACHE_POLICY");
    return v != nullptr && std::strcmp(v, "lru") == 0 ? Ranking::Lru : Ranking::Frequency;
}

void ExpertCache::set_budget(uint64_t budget_bytes) {
    budget_ = budget_bytes;
    const uint64_t slots = slot_bytes_ == 0 ? 0 : budget_ / slot_bytes_;
    per_layer_ = static_cast<int>(std::min<uint64_t>(slots, static_cast<uint64_t>(std::numeric_limits<int>::max())));
    shares_.assign(layers_.size(), 0);
    uint64_t rest = per_layer_ > 0 && ranking_ == Ranking::Frequency ? budget_ - slots * slot_bytes_ : 0;
    for (size_t l = 0; l < layers_.size(); ++l) {
        if (expert_bytes_[l] == 0 || inactive_[l]) {
            continue;
        }
        shares_[l] = per_layer_;
        if (expert_bytes_[l] <= rest) {  // the rest: one more expert where it pays for one
            ++shares_[l];
            rest -= expert_bytes_[l];
        }
    }
}

void ExpertCache::visit(int layer) {
    for (double & u : layers_[static_cast<size_t>(layer)].uses) {
        u *= kAging;
    }
}

bool ExpertCache::touch(const ExpertKey & key, int uses) {
    Layer & l = layers_[static_cast<size_t>(key.layer)];
    const auto e = static_cast<size_t>(key.expert);
    l.uses[e] += uses;
    if (!l.present[e]) {
        return false;
    }
    l.lru.splice(l.lru.begin(), l.lru, l.where[e]);
    return true;
}

bool ExpertCache::contains(const ExpertKey & key) const {
    return layers_[static_cast<size_t>(key.layer)].present[static_cast<size_t>(key.expert)];
}

std::vector<int> ExpertCache::resident(int layer) const {
    const std::list<int> & lru = layers_[static_cast<size_t>(layer)].lru;
    return {lru.begin(), lru.end()};
}

void ExpertCache::insert(const ExpertKey & key) {
    Layer & l = layers_[static_cast<size_t>(key.layer)];
    const auto e = static_cast<size_t>(key.expert);
    if (l.present[e]) {
        return;
    }
    l.lru.push_front(key.expert);
    l.where[e] = l.lru.begin();
    l.present[e] = true;
    bytes_ += expert_bytes_[static_cast<size_t>(key.layer)];
    ++entries_;
}

void ExpertCache::drop(int layer, std::list<int>::iterator it) {
    Layer & l = layers_[static_cast<size_t>(layer)];
    l.present[static_cast<size_t>(*it)] = false;
    l.lru.erase(it);
    bytes_ -= expert_bytes_[static_cast<size_t>(layer)];
    --entries_;
}

std::list<int>::iterator ExpertCache::victim(Layer & l) {
    auto worst = std::prev(l.lru.end());
    if (ranking_ == Ranking::Lru) {
        return worst;
    }
    // From the least recent up: the lowest count, and of equal counts the least recent.
    for (auto it = worst; it != l.lru.begin();) {
        --it;
        if (l.uses[static_cast<size_t>(*it)] < l.uses[static_cast<size_t>(*worst)]) {
            worst = it;
        }
    }
    return worst;
}

std::vector<ExpertKey> ExpertCache::evict_over_budget(int pinned_layer) {
    std::vector<ExpertKey> victims;
    for (size_t i = 0; i < layers_.size(); ++i) {
        const int layer = static_cast<int>(i);
        Layer & l = layers_[i];
        while (layer != pinned_layer && l.lru.size() > static_cast<size_t>(shares_[i])) {
            auto it = victim(l);
            victims.push_back({layer, *it});
            drop(layer, it);
        }
    }
    return victims;
}

std::vector<ExpertKey> ExpertCache::set_active(int layer, bool active) {
    const auto l = static_cast<size_t>(layer);
    std::vector<ExpertKey> out;
    if (l >= layers_.size() || inactive_[l] == !active) {
        return out;
    }
    inactive_[l] = !active;
    if (!active) {
        while (!layers_[l].lru.empty()) {
            out.push_back({layer, layers_[l].lru.front()});
            drop(layer, layers_[l].lru.begin());
        }
        slot_bytes_ -= expert_bytes_[l];
    } else {
        slot_bytes_ += expert_bytes_[l];
    }
    set_budget(budget_);
    return out;
}

void ExpertCache::evict_layer(int layer, const std::vector<int> & experts) {
    Layer & l = layers_[static_cast<size_t>(layer)];
    for (int e : experts) {
        if (l.present[static_cast<size_t>(e)]) {
            drop(layer, l.where[static_cast<size_t>(e)]);
        }
    }
}

}  // namespace bmoe::detail
