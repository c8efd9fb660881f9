// The expert cache's sizing, pure functions of the model's shape and the settings (the engine's open applies
// them: engine/streaming.cpp's size_cache; native/tests/test_cache_sizing.cpp pins them): what stays
// resident beyond the cache while a step runs, what vm.max_map_count lets the cache map, and whether its
// pool takes huge pages. MemoryBudget (memory_budget.h) spends what is left.
#pragma once

#include <cstdint>

namespace bmoe::detail {

struct CacheShape {
    uint64_t n_expert = 0;             // a layer's experts
    uint64_t n_expert_used = 0;        // routed per token
    int parallel = 1;                  // --parallel's sequences in one step
    bool prefetch = false;             // --prefetch on (predict or auto)
    uint64_t widest_expert_bytes = 0;  // one expert of the widest layer, every projection
    uint64_t projections = 0;          // streamed tensors per layer
    uint64_t page_size = 0;            // the mirror's page unit
};

// Expert bytes resident beyond the cache: the layer being computed and the one being read (overlap), and
// with read-ahead the next layer's guesses, each slice rounded out to units. A --parallel step's sequences
// route to up to `parallel` times a token's experts per layer (their union, at most every expert).
uint64_t in_flight_bytes(const CacheShape & shape);

// The most the cache can hold under the mappings left (vm.max_map_count): each cached slice is a mapping
// moved into the mirror, splitting the reservation around it, and leaves the same split behind in the pool.
// UINT64_MAX (no limit) where the count is unknown, or where the cache could hold every expert anyway.
uint64_t mappings_cap_bytes(uint64_t maps_free, uint64_t projections, int n_layers, uint64_t bytes_per_token_slot,
                            uint64_t all_experts_bytes);

// Huge pages make a slice's read a few DMA segments; they pay where slices are read every token. A cache
// that holds every expert reads nothing once full, and a reclaimer working through physical memory (this
// VM's DAMON pageout) splits huge pages: 0.63 of resident against 0.98 in plain pages (docs/memory.md).
// There, plain pages.
inline bool pool_wants_huge_pages(uint64_t budget, uint64_t all_experts_bytes) { return budget < all_experts_bytes; }

}  // namespace bmoe::detail
