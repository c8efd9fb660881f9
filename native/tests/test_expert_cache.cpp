// ExpertCache (expert_cache.h, docs/streaming.md "The expert cache and overlap"): per-layer shares of the budget
// (the rest one more expert for the first layers it pays for), the layer being computed never a
// victim, and inside a layer the lowest aged use count goes first (a step's tokens each count), ties
// least recent; Ranking::Lru is the cache before it (equal shares, least recent first).
#include <vector>

#include "check.h"
#include "policy/expert_cache.h"

using bmoe::detail::ExpertCache;
using bmoe::detail::ExpertKey;
using bmoe::detail::Ranking;

namespace {

constexpr uint64_t kSize = 100;

ExpertCache cache(uint64_t budget, int layers = 3, int n_expert = 16, Ranking r = Ranking::Frequency) {
    return ExpertCache(budget, std::vector<uint64_t>(static_cast<size_t>(layers), kSize),
                       std::vector<int>(static_cast<size_t>(layers), n_expert), r);
}

// One visit of a layer as the streamer makes it: age, count and look up each distinct expert (the
// tokens that routed to it), insert the misses, then the other layers are trimmed.
int visit(ExpertCache & c, int layer, const std::vector<std::pair<int, int>> & experts_uses) {
    c.visit(layer);
    int hits = 0;
    for (const auto & [e, uses] : experts_uses) {
        if (c.touch({layer, e}, uses)) {
            ++hits;
        } else {
            c.insert({layer, e});
        }
    }
    c.evict_over_budget(-1);
    return hits;
}

std::vector<std::pair<int, int>> once(const std::vector<int> & experts) {
    std::vector<std::pair<int, int>> out;
    for (int e : experts) {
        out.emplace_back(e, 1);
    }
    return out;
}

bool resident(const ExpertCache & c, int layer, int e) { return c.contains({layer, e}); }

}  // namespace

POLICY_TEST(shares_are_equal_and_the_rest_buys_one_more_for_the_first_layers) {
    ExpertCache c = cache(2 * 3 * kSize + 2 * kSize + 50);  // 2 a layer, and a rest of 2.5 experts
    CHECK_EQ(c.per_layer(), 2);
    CHECK_EQ(c.share(0), 3);
    CHECK_EQ(c.share(1), 3);
    CHECK_EQ(c.share(2), 2);
    ExpertCache lru = cache(2 * 3 * kSize + 2 * kSize + 50, 3, 16, Ranking::Lru);
    CHECK_EQ(lru.share(0), 2);  // the cache before: equal shares only
    ExpertCache small = cache(3 * kSize - 1);  // below one expert of every layer: nothing (it could never hit)
    CHECK_EQ(small.per_layer(), 0);
    CHECK_EQ(small.share(0), 0);
    ExpertCache mixed(1000, {100, 0, 300}, {8, 0, 8});  // a layer without experts takes no share
    CHECK_EQ(mixed.per_layer(), 2);
    CHECK_EQ(mixed.share(0), 3);  // the rest (200) buys one more of layer 0's, not of layer 2's
    CHECK_EQ(mixed.share(1), 0);
    CHECK_EQ(mixed.share(2), 2);
}

POLICY_TEST(a_batch_wider_than_the_share_does_not_sweep_out_the_experts_used_most) {
    // Share 3; experts 1, 2, 3 come back every step; then a step routes to 1 and six others once each.
    for (Ranking r : {Ranking::Frequency, Ranking::Lru}) {
        ExpertCache c = cache(3 * 3 * kSize, 3, 16, r);
        for (int step = 0; step < 6; ++step) {
            visit(c, 0, once({1, 2, 3}));
        }
        visit(c, 0, once({1, 9, 10, 11, 12, 13, 14}));
        if (r == Ranking::Frequency) {
            CHECK(resident(c, 0, 1) && resident(c, 0, 2) && resident(c, 0, 3));
            CHECK_EQ(visit(c, 0, once({1, 2, 3})), 3);
        } else {  // LRU keeps the step's last touched: its highest ids
            CHECK(resident(c, 0, 12) && resident(c, 0, 13) && resident(c, 0, 14));
            CHECK_EQ(visit(c, 0, once({1, 2, 3})), 0);
        }
    }
}

POLICY_TEST(an_expert_several_tokens_share_outranks_one_routed_once) {
    ExpertCache c = cache(2 * 3 * kSize);  // share 2
    visit(c, 0, {{4, 3}, {5, 1}});          // four tokens of a step: three routed to 4
    visit(c, 0, {{6, 1}});
    CHECK(resident(c, 0, 4) && resident(c, 0, 6));
    CHECK(!resident(c, 0, 5));  // one use, one visit older than 6's
    visit(c, 0, {{7, 1}, {8, 1}});
    CHECK(resident(c, 0, 4) && resident(c, 0, 8));
    CHECK(!resident(c, 0, 7));  // equal counts: the least recent goes (8 was touched after 7)
}

POLICY_TEST(counts_age_so_a_new_working_set_takes_over) {
    ExpertCache c = cache(2 * 3 * kSize);
    for (int step = 0; step < 200; ++step) {
        visit(c, 0, once({1, 2}));
    }
    int took_over = -1;
    for (int step = 0; step < 200 && took_over < 0; ++step) {
        visit(c, 0, once({step % 2 == 0 ? 3 : 4, 5}));
        if (resident(c, 0, 5)) {
            took_over = step;
        }
    }
    // 1 and 2 hold ~46 uses (half-life 32 visits); 5, used every visit, passes them within a half-life
    CHECK(took_over > 0);
    CHECK(took_over < 40);
}

POLICY_TEST(the_layer_being_computed_is_never_a_victim_and_an_idle_layer_gives_its_share_back) {
    ExpertCache c = cache(1 * 3 * kSize);
    c.visit(1);
    for (int e : {1, 2, 3}) {
        c.touch({1, e});
        c.insert({1, e});
    }
    CHECK(c.evict_over_budget(1).empty());
    CHECK_EQ(c.evict_over_budget(0).size(), size_t{2});
    CHECK_EQ(c.size(), size_t{1});
    CHECK_EQ(c.resident_bytes(), kSize);
    CHECK_EQ(c.set_active(1, false).size(), size_t{1});  // its entries leave
    CHECK_EQ(c.share(1), 0);
    CHECK_EQ(c.share(0), 2);  // 300 over two layers: 1 each, and the rest (100) one more for layer 0
    CHECK_EQ(c.share(2), 1);
    c.set_active(1, true);
    CHECK_EQ(c.share(1), 1);
}

POLICY_TEST(lru_ranking_is_the_cache_before_issue_30) {
    ExpertCache c = cache(2 * 3 * kSize, 3, 16, Ranking::Lru);
    for (int e : {1, 2, 3}) {
        c.insert({0, e});
    }
    CHECK(c.evict_over_budget(0).empty());
    const std::vector<ExpertKey> v = c.evict_over_budget(1);
    CHECK_EQ(v.size(), size_t{1});
    CHECK_EQ(v.front().expert, 1);
    CHECK(c.touch({0, 2}) && !c.touch({0, 1}));
    c.insert({0, 4});
    CHECK_EQ(c.evict_over_budget(-1).front().expert, 3);  // 2 was touched after 3
}
