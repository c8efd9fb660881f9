// Everything a caller can set on the engine. Plain data; validated when an Engine opens.
#pragma once

#include <cstdint>
#include <string>

namespace bmoe {

enum class ReadPath { Pread, ODirect };
enum class DenseMode { Mmap, Anon };

// Test-only fault injection: act on the Nth slice read of the engine (1-based, counted across
// the engine's life). Also settable with BMOE_FAULT=corrupt:N or BMOE_FAULT=fail:N.
enum class FaultKind { None, Corrupt, Fail };
struct FaultInjection {
    FaultKind kind = FaultKind::None;
    int64_t nth = 0;
};

constexpr double kCacheAuto = -1;

struct StreamConfig {
    bool stream = true;               // false: a plain resident llama.cpp run (no eval callback)
    double cache_mb = 0;              // MiB (fractions allowed); 0 = nothing kept beyond the layer in flight; kCacheAuto = auto
    int64_t cache_floor_mb = 1024;    // where the machine's memory is the limit: leave this much to other processes
    int64_t cache_ceil_mb = 1 << 20;  // auto: never more than this
    int64_t cache_margin_mb = 64;     // kept free under the limit for everything the budget cannot foresee
    int page_kb = 0;                  // the mirror's page unit in KiB (a power of two >= the kernel's page); 0 = the kernel's
    int io_threads = 4;               // read lanes, each with its own file descriptors
    ReadPath read_path = ReadPath::ODirect;
    DenseMode dense = DenseMode::Mmap;
    bool overlap = false;             // I/O-compute overlap through the expert-ready hook
    int threads = 0;                  // compute threads; 0 = all cores resident, all but one while streaming
    int ctx = 2048;
    int batch = 512;
    int ubatch = 512;
    bool flash_attn = false;
    std::string route_trace;          // a CSV of every token's routed experts per layer (empty = none)
    bool speculative_ngram = false;   // greedy decoding verifies prompt-lookup drafts in one batch
    int draft_max = 8;                // ... of at most this many tokens
    FaultInjection fault;
};

struct SamplingParams {
    float temp = 0.0f;  // 0 = greedy
    int top_k = 40;
    float top_p = 0.95f;
    float min_p = 0.0f;  // 0 = off
    uint32_t seed = 0;
};

const char * to_string(ReadPath path);
const char * to_string(DenseMode mode);

}  // namespace bmoe
