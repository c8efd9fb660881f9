// The cache's sizing (cache_sizing.h): what stays resident beyond the cache while a step runs, the cap
// vm.max_map_count puts on it, and the pool's huge-page choice.
#include <cstdint>

#include "check.h"
#include "policy/cache_sizing.h"

using bmoe::detail::CacheShape;
using bmoe::detail::in_flight_bytes;
using bmoe::detail::mappings_cap_bytes;
using bmoe::detail::pool_wants_huge_pages;

namespace {

constexpr uint64_t kMiB = 1ull << 20;

// A 64-expert, top-8 layer of three projections, 1.5 MiB an expert, 16 KiB pages.
CacheShape decode_shape() {
    CacheShape s;
    s.n_expert = 64;
    s.n_expert_used = 8;
    s.widest_expert_bytes = 3 * kMiB / 2;
    s.projections = 3;
    s.page_size = 16384;
    return s;
}

}  // namespace

POLICY_TEST(in_flight_is_two_layers_of_routed_experts_each_slice_rounded_out) {
    // 8 experts of 1.5 MiB, and 24 slices each rounded out by up to a page at either end, for two layers.
    CHECK_EQ(in_flight_bytes(decode_shape()), 2 * (8 * (3 * kMiB / 2) + 24 * 2 * 16384));
}

POLICY_TEST(in_flight_read_ahead_holds_a_third_layer) {
    CacheShape s = decode_shape();
    s.prefetch = true;
    CHECK_EQ(in_flight_bytes(s), 3 * in_flight_bytes(decode_shape()) / 2);
}

POLICY_TEST(in_flight_parallel_routes_the_union_up_to_every_expert) {
    CacheShape s = decode_shape();
    s.parallel = 2;
    CHECK_EQ(in_flight_bytes(s), 2 * in_flight_bytes(decode_shape()));
    s.parallel = 16;  // 128 routed, but a layer has 64
    const uint64_t all = in_flight_bytes(s);
    s.parallel = 8;
    CHECK_EQ(all, in_flight_bytes(s));
}

POLICY_TEST(mappings_cap_only_where_it_limits) {
    const uint64_t slot = 48 * kMiB;  // a token slot: one expert of every layer
    CHECK_EQ(mappings_cap_bytes(UINT64_MAX, 3, 24, slot, 10000 * kMiB), UINT64_MAX);  // the count unknown
    CHECK_EQ(mappings_cap_bytes(65530, 0, 24, slot, 10000 * kMiB), UINT64_MAX);       // nothing streamed
    // 65530 mappings, 12 per expert, 24 layers: 227 experts a layer, each slot 48 MiB.
    CHECK_EQ(mappings_cap_bytes(65530, 3, 24, slot, 20000 * kMiB), 227 * slot);
    CHECK_EQ(mappings_cap_bytes(65530, 3, 24, slot, 227 * slot), UINT64_MAX);  // holds every expert anyway
    CHECK_EQ(mappings_cap_bytes(65530, 3, 0, slot, 300000 * kMiB), 5460 * slot);  // no layer counted as one
}

POLICY_TEST(huge_pages_only_where_slices_are_read_every_token) {
    CHECK(pool_wants_huge_pages(100 * kMiB, 200 * kMiB));
    CHECK(!pool_wants_huge_pages(200 * kMiB, 200 * kMiB));
    CHECK(!pool_wants_huge_pages(300 * kMiB, 200 * kMiB));
}
