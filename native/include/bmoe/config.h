// Everything a caller can set on the engine. Plain data; validated when an Engine opens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bmoe {

enum class ReadPath { Pread, ODirect };
enum class DenseMode { Mmap, Anon };
// Read-ahead of the next layer's predicted experts: never, every decode, or where it measurably pays.
enum class Prefetch { Off, Predict, Auto };

// Test-only fault injection: act on the Nth slice read of the engine (1-based, counted across
// the engine's life). Also settable with BMOE_FAULT=<kind>:N. corrupt garbles 256 bytes of the
// slice after the read (once: a re-read gets the file's bytes), fail fails the read, short reads
// half the slice and reports a short read, hang stalls the read for hang_s seconds and then does it
// (the engine sets hang_s: its I/O deadline plus 2 s, or 5 s without one).
enum class FaultKind { None, Corrupt, Fail, Short, Hang };
struct FaultInjection {
    FaultKind kind = FaultKind::None;
    int64_t nth = 0;
    double hang_s = 5.0;
};

// The expected CRC-32C of one expert slice: `length` bytes at `offset` of file `file` (the shard
// index). Written by `bmoe-edge verify-model` into the model's sidecar; checked with verify_slices.
struct SliceSum {
    uint32_t file = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
    uint32_t crc32c = 0;
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
    Prefetch prefetch = Prefetch::Auto;  // read the next layer's predicted experts ahead (lossless)
    int threads = 0;                  // compute threads; 0 = all cores resident, all but one while streaming
    int ctx = 2048;
    int batch = 512;
    int ubatch = 512;
    bool flash_attn = false;
    std::string route_trace;          // a CSV of every token's routed experts per layer (empty = none)
    int n_expert_used = 0;            // lossy when > 0: route every token to this many experts (0 = the model's)
    double drop_cold = 0;             // lossy when > 0: skip a routed expert that is not resident and carries less
                                      // than this share of its token's routing weight (renormalised)
    bool speculative_ngram = false;   // greedy decoding verifies prompt-lookup drafts in one batch
    int draft_max = 8;                // ... of at most this many tokens
    double io_timeout_s = 30;         // a read making no progress this long fails the decode; 0 = wait forever
    bool verify_slices = false;       // check every slice read against slice_sums (re-read once, then fail)
    std::vector<SliceSum> slice_sums; // every streamed slice's sum (required with verify_slices)
    bool parse_special = false;       // tokenize() turns special-token text (e.g. "</s>") into control tokens
    FaultInjection fault;
    // llama.cpp RPC workers (`host:port` of an rpc-server each, probed beforehand): whole layers are
    // placed there, resident; this process keeps the first layers and streams their experts.
    std::vector<std::string> rpc_endpoints;
    std::vector<double> rpc_split;    // layer shares: this process first, then each worker; empty = by memory
    double rpc_timeout_s = 300;       // a decode waiting this long on the workers ends the process; 0 = never
};

struct SamplingParams {
    float temp = 0.0f;  // 0 = greedy
    int top_k = 40;
    float top_p = 0.95f;
    float min_p = 0.0f;  // 0 = off
    uint32_t seed = 0;
    std::string grammar;  // GBNF with a `root` rule: only tokens it allows are sampled; empty = off
};

const char * to_string(ReadPath path);
const char * to_string(DenseMode mode);
const char * to_string(Prefetch prefetch);

}  // namespace bmoe
