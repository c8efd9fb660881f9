// Telemetry: per generated token, and per run (the resolved configuration and what was measured).
#pragma once

#include <cstdint>
#include <string>

namespace bmoe {

struct TokenMetrics {
    int step = 0;
    int n_tokens = 0;               // tokens decoded in this step (the prompt for step 0)
    double wall_ms = 0;
    double io_ms = 0;               // wall time during which at least one on-demand read of this step was in flight
                                    // (read-ahead batches run beside compute and are not counted)
    double stall_ms = 0;            // compute blocked on reads (overlap: per compute thread, averaged)
    double drain_ms = 0;            // overlap: waiting for the previous layer's reads before publishing
    double compute_ms = 0;          // wall - stall
    uint64_t bytes_read = 0;        // bytes read from the file (O_DIRECT windows included)
    uint64_t slice_bytes = 0;       // bytes of the expert slices made resident
    uint64_t copy_bytes = 0;        // bytes that went through an intermediate buffer (0 = zero-copy)
    uint64_t cache_lookups = 0;
    uint64_t cache_hits = 0;
    uint64_t evictions = 0;
    uint64_t rereads = 0;           // verify_slices: slices read again because the first read failed its checksum
    uint64_t major_faults = 0;
    uint64_t rss_bytes = 0;
    uint64_t resident_expert_bytes = 0;  // whole pages of the mirror currently holding expert bytes
    uint64_t cache_budget_bytes = 0;     // the budget in force after this step (it adapts to memory pressure)
    uint64_t pool_bytes = 0;             // memory the expert page pool holds (in use, or kept for reuse)
    int drafted = 0;                     // speculative step: draft tokens decoded with this one
    int accepted = 0;                    // ... of which the model agreed with (handed out next, no decode)
    int probed = 0;                      // a draft checked against this step's own token, not decoded with it
                                         // (after drafts rejected outright twice in a row: DraftPolicy::probing)
    int dropped = 0;                     // --drop-cold (lossy): routed slots skipped
    bool read_ahead = false;             // this step guessed each next layer's experts and read them ahead
    uint64_t predicted = 0;              // expert slots guessed ahead (per layer, before its router ran)
    uint64_t predicted_correct = 0;      // ... that the router then chose
    uint64_t ahead_bytes = 0;            // bytes read for guesses
    uint64_t ahead_wasted_bytes = 0;     // ... for guesses the router did not choose
    uint64_t net_bytes = 0;              // RPC: bytes sent to and received from the workers in this step
    uint64_t routed_bytes = 0;           // bytes of the distinct experts this step routed to (once each)
    uint64_t released_bytes = 0;         // a prompt's step: compute-buffer memory given back after it
};

struct RunInfo {
    std::string model;
    std::string speculative = "off";
    std::string lossy;                // what makes this run's output differ from the model's ("" = lossless)  // "ngram" when greedy decoding verifies drafts
    std::string architecture;
    int n_layer = 0;
    int n_expert = 0;
    int n_expert_used = 0;
    bool streaming = false;
    int streamed_tensors = 0;
    uint64_t expert_bytes = 0;      // all streamed expert bytes in the file(s)
    uint64_t file_bytes = 0;
    int n_files = 0;
    // resolved configuration
    int threads = 0;
    int io_threads = 0;
    std::string read_path_requested;
    std::string read_path;           // what is actually used
    std::string read_path_note;      // why it differs, if it does
    uint64_t dio_align = 0;
    uint64_t page_size = 0;          // the mirror's page unit
    uint64_t kernel_page_size = 0;
    double cache_budget_mb = 0;
    std::string cache_mode;          // "off", "fixed", "auto"
    std::string cache_note;          // why the budget is what it is (clamped, cannot hit), if anything
    std::string memory_limit_source; // the tightest limit: "machine" or the cgroup's path
    double memory_limit_mb = 0;
    double memory_headroom_mb = 0;   // what the cache could take at open
    double memory_pending_mb = 0;    // KV cache, compute buffers, dense weights not yet touched at open
    bool cache_adaptive = false;     // the budget follows memory pressure while running
    std::string dense;
    bool overlap = false;
    std::string prefetch = "off";      // read-ahead: off, predict or auto
    std::string prefetch_note;         // why it is not what was asked, if it is not
    bool hook_compiled_in = false;
    bool lazy_load = false;          // patch 0002: expert ranges not prefetched at load
    int ctx = 0;
    int batch = 0;
    int ubatch = 0;
    bool flash_attn = false;
    std::string fault;
    double io_timeout_s = 0;         // the I/O deadline (0: none)
    bool verify_slices = false;      // every slice read is checked against the model's checksums
    bool parse_special = false;      // prompts may contain control tokens as text
    std::string warning;
    // load
    double load_ms = 0;
    uint64_t load_bytes_read = 0;    // storage reads during load (/proc/self/io read_bytes)
    uint64_t load_major_faults = 0;
    uint64_t rss_after_load = 0;
    uint64_t routed_bytes_per_token = 0;  // n_expert_used slices of every streamed tensor
    // RPC: which layers live where ("main 0-3 (streamed); 10.0.0.2:50052 4-7 + output"), "" without workers
    std::string placement;
    int rpc_workers = 0;
    int main_layers = 0;                  // layers [0, main_layers) are in this process
};

}  // namespace bmoe
