// Telemetry: per generated token, and per run (the resolved configuration and what was measured), each field
// declared once: one row of an X-macro list below. The rows expand into the structs (here), their bindings
// (module.cpp) and the description the Python side builds its records from (`token_metrics_fields()`,
// `run_info_fields()`: the TokenMetrics record of bmoe_edge.engine.generation, the run info's keys, the metrics
// CSV's columns). Nothing else lists the fields: adding one is adding a row.
//
// A row is X(type, name, default, help); type is bool, int, int64_t/uint64_t, double or std::string.
// (Comments between rows are /* */: a // comment would swallow the macro's next line.)
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace bmoe {

#define BMOE_TOKEN_METRICS(X)                                                                                         \
    X(int, step, 0, "The step's index (0: the prompt).")                                                              \
    X(int, n_tokens, 0, "Tokens decoded in this step (the prompt for step 0).")                                      \
    X(double, wall_ms, 0, "The step's wall time.")                                                                    \
    X(double, io_ms, 0,                                                                                               \
      "Wall time during which at least one on-demand read of this step was in flight (read-ahead batches run "      \
      "beside compute and are not counted).")                                                                         \
    X(double, stall_ms, 0, "Compute blocked on reads (overlap: per compute thread, averaged).")                       \
    X(double, drain_ms, 0, "Overlap: waiting for the previous layer's reads before publishing.")                      \
    X(double, compute_ms, 0, "wall - stall.")                                                                         \
    X(uint64_t, bytes_read, 0, "Bytes read from the file (O_DIRECT windows included).")                              \
    X(uint64_t, slice_bytes, 0, "Bytes of the expert slices made resident.")                                         \
    X(uint64_t, copy_bytes, 0, "Bytes that went through an intermediate buffer (0 = zero-copy).")                    \
    X(double, convert_ms, 0, "--repack: read lanes converting slices to the kernels' layout, summed over lanes.")     \
    X(int, whole_graphs, 0,                                                                                           \
      "Decode calls of this step computed in one piece: every streamed expert was resident, so no layer's router "   \
      "was isolated (its experts count as hits after the call).")                                                     \
    X(uint64_t, cache_lookups, 0, "Expert cache lookups.")                                                            \
    X(uint64_t, cache_hits, 0, "... of which the expert was resident.")                                               \
    X(uint64_t, evictions, 0, "Experts evicted from the cache.")                                                      \
    X(uint64_t, rereads, 0, "verify_slices: slices read again because the first read failed its checksum.")          \
    X(uint64_t, major_faults, 0, "Major page faults of the process in this step.")                                   \
    X(uint64_t, rss_bytes, 0, "The process's resident set after this step.")                                         \
    X(uint64_t, resident_expert_bytes, 0, "Whole pages of the mirror currently holding expert bytes.")               \
    X(uint64_t, cache_budget_bytes, 0, "The budget in force after this step (it adapts to memory pressure).")         \
    X(uint64_t, pool_bytes, 0, "Memory the expert page pool holds (in use, or kept for reuse).")                     \
    X(int, drafted, 0, "Speculative step: draft tokens decoded with this one.")                                       \
    X(int, accepted, 0, "... of which the model agreed with (handed out next, no decode).")                          \
    X(int, probed, 0,                                                                                                 \
      "A draft checked against this step's own token, not decoded with it (after drafts rejected outright twice in " \
      "a row: DraftPolicy::probing).")                                                                                \
    X(int, dropped, 0, "--drop-cold (lossy): routed slots skipped.")                                                  \
    X(bool, read_ahead, false, "This step guessed each next layer's experts and read them ahead.")                    \
    X(uint64_t, predicted, 0, "Expert slots guessed ahead (per layer, before its router ran).")                       \
    X(uint64_t, predicted_correct, 0, "... that the router then chose.")                                              \
    X(uint64_t, ahead_bytes, 0, "Bytes read for guesses.")                                                            \
    X(uint64_t, ahead_wasted_bytes, 0, "... for guesses the router did not choose.")                                  \
    X(uint64_t, guessed_bytes, 0,                                                                                     \
      "Bytes of the guessed experts that were not cached: read ahead, or (prefetch auto, not reading ahead) only "    \
      "counted.")                                                                                                     \
    X(uint64_t, guessed_wasted_bytes, 0, "... of experts the router did not choose.")                                 \
    X(uint64_t, net_bytes, 0, "RPC: bytes sent to and received from the workers in this step.")                       \
    X(uint64_t, routed_bytes, 0, "Bytes of the distinct experts this step routed to (once each).")                    \
    X(uint64_t, released_bytes, 0, "A prompt's step: compute-buffer memory given back after it.")

#define BMOE_RUN_INFO(X)                                                                                              \
    X(std::string, model, "", "The model file.")                                                                      \
    X(std::string, speculative, "off", "The speculation in force (\"ngram\" when greedy decoding verifies drafts).")  \
    X(std::string, lossy, "", "What makes this run's output differ from the model's (\"\" = lossless).")             \
    X(std::string, architecture, "", "The gguf's architecture.")                                                      \
    X(int, n_layer, 0, "Layers.")                                                                                     \
    X(int, n_expert, 0, "Experts per MoE layer.")                                                                     \
    X(int, n_expert_used, 0, "Experts each token routes to.")                                                         \
    X(bool, streaming, false, "The experts are streamed.")                                                           \
    X(int, streamed_tensors, 0, "Expert tensors streamed.")                                                           \
    X(uint64_t, expert_bytes, 0, "All streamed expert bytes in the file(s).")                                        \
    X(uint64_t, file_bytes, 0, "The model's bytes (every shard).")                                                    \
    X(int, n_files, 0, "Shards.")                                                                                     \
    /* the resolved configuration */                                                                                  \
    X(int, threads, 0, "Compute threads (auto resolved).")                                                           \
    X(int, io_threads, 0, "Read lanes.")                                                                              \
    X(std::string, read_path_requested, "", "The read path asked for.")                                               \
    X(std::string, read_path, "", "What is actually used.")                                                           \
    X(std::string, read_path_note, "", "Why it differs, if it does.")                                                 \
    X(uint64_t, dio_align, 0, "O_DIRECT's alignment.")                                                                \
    X(uint64_t, page_size, 0, "The mirror's page unit.")                                                              \
    X(uint64_t, kernel_page_size, 0, "The kernel's page.")                                                            \
    X(double, cache_budget_mb, 0, "The expert cache's budget at open.")                                               \
    X(std::string, cache_mode, "", "\"off\", \"fixed\" or \"auto\".")                                                 \
    X(std::string, cache_note, "", "Why the budget is what it is (clamped, cannot hit), if anything.")               \
    X(std::string, memory_limit_source, "", "The tightest limit: \"machine\" or the cgroup's path.")                 \
    X(double, memory_limit_mb, 0, "That limit.")                                                                      \
    X(double, memory_headroom_mb, 0, "What the cache could take at open.")                                            \
    X(double, memory_pending_mb, 0, "KV cache, compute buffers, dense weights not yet touched at open.")             \
    X(bool, cache_adaptive, false, "The budget follows memory pressure while running.")                               \
    X(std::string, dense, "", "Dense weights: mmap or anon.")                                                         \
    X(std::string, repack, "off", "llama.cpp's repacked kernels in force: off, dense or all (auto resolved).")       \
    X(std::string, repack_layouts, "",                                                                                \
      "The layout each streamed expert type got (\"q4_K: q4_K_8x8, q6_K: file\"; file = the plain kernels).")        \
    X(int, repacked_dense_tensors, 0, "Dense weights llama.cpp repacked at load (anonymous memory).")                 \
    X(uint64_t, repacked_dense_bytes, 0, "... and their bytes.")                                                      \
    X(bool, overlap, false, "I/O-compute overlap in force.")                                                          \
    X(std::string, prefetch, "off", "Read-ahead: off, predict or auto.")                                              \
    X(std::string, prefetch_note, "", "Why it is not what was asked, if it is not.")                                  \
    X(bool, hook_compiled_in, false, "The build has the expert-ready hook (patch 0001).")                            \
    X(bool, lazy_load, false, "Patch 0002: expert ranges not prefetched at load.")                                   \
    X(int, ctx, 0, "Context length (per sequence).")                                                                  \
    X(int, batch, 0, "Logical batch size.")                                                                           \
    X(int, ubatch, 0, "Physical batch size.")                                                                         \
    X(bool, flash_attn, false, "Flash attention, as llama.cpp resolved it.")                                          \
    X(std::string, fault, "", "Test only: the fault injected.")                                                       \
    X(double, io_timeout_s, 0, "The I/O deadline (0: none).")                                                         \
    X(bool, verify_slices, false, "Every slice read is checked against the model's checksums.")                       \
    X(bool, parse_special, false, "Prompts may contain control tokens as text.")                                      \
    X(std::string, warning, "", "What the user should know about this run.")                                          \
    /* load */                                                                                                        \
    X(double, load_ms, 0, "Load time.")                                                                               \
    X(uint64_t, load_bytes_read, 0, "Storage reads during load (/proc/self/io read_bytes).")                         \
    X(uint64_t, load_major_faults, 0, "Major page faults during load.")                                               \
    X(uint64_t, rss_after_load, 0, "The resident set after load.")                                                    \
    X(uint64_t, routed_bytes_per_token, 0, "n_expert_used slices of every streamed tensor.")                          \
    /* RPC */                                                                                                         \
    X(std::string, placement, "",                                                                                     \
      "Which layers live where (\"main 0-3 (streamed); 10.0.0.2:50052 4-7 + output\"), \"\" without workers.")        \
    X(int, rpc_workers, 0, "RPC workers.")                                                                            \
    X(int, main_layers, 0, "Layers [0, main_layers) are in this process.")

#define BMOE_RECORD_FIELD(type, name, default_value, help) type name = default_value;

struct TokenMetrics {
    BMOE_TOKEN_METRICS(BMOE_RECORD_FIELD)
};

struct RunInfo {
    BMOE_RUN_INFO(BMOE_RECORD_FIELD)
};

// What the bindings export for each row: the Python records are built from it.
struct FieldInfo {
    std::string name;
    std::string kind;  // bool, int, float, str
    std::string help;
};

template <typename T>
constexpr const char * field_kind() {
    static_assert(std::is_arithmetic_v<T> || std::is_same_v<T, std::string>, "a record field is a number or text");
    return std::is_same_v<T, bool>             ? "bool"
           : std::is_integral_v<T>          ? "int"
           : std::is_floating_point_v<T>    ? "float"
                                            : "str";
}

#define BMOE_FIELD_INFO(type, name, default_value, help) FieldInfo{#name, field_kind<type>(), help},

inline std::vector<FieldInfo> token_metrics_fields() { return {BMOE_TOKEN_METRICS(BMOE_FIELD_INFO)}; }
inline std::vector<FieldInfo> run_info_fields() { return {BMOE_RUN_INFO(BMOE_FIELD_INFO)}; }

}  // namespace bmoe
