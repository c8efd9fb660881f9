#include "policy/cache_sizing.h"

#include <algorithm>

namespace bmoe::detail {

uint64_t in_flight_bytes(const CacheShape & s) {
    const uint64_t routed = std::min<uint64_t>(s.n_expert, s.n_expert_used * static_cast<uint64_t>(s.parallel));
    const uint64_t slices = routed * s.projections;
    return (s.prefetch ? 3 : 2) * (routed * s.widest_expert_bytes + slices * 2 * s.page_size);
}

uint64_t mappings_cap_bytes(uint64_t maps_free, uint64_t projections, int n_layers, uint64_t bytes_per_token_slot,
                            uint64_t all_experts_bytes) {
    const uint64_t per_expert_maps = 4 * projections;
    if (maps_free == UINT64_MAX || per_expert_maps == 0) {
        return UINT64_MAX;
    }
    const uint64_t cap = maps_free / per_expert_maps / static_cast<uint64_t>(std::max(1, n_layers)) * bytes_per_token_slot;
    return cap < all_experts_bytes ? cap : UINT64_MAX;  // only a limit where the cache could otherwise hold more
}

}  // namespace bmoe::detail
