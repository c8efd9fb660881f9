// Every setting of the engine and of sampling, declared once: each is one row of an X-macro list below.
// The rows expand into the config structs and their defaults (here), the validation (config.cpp), the
// binding (module.cpp) and the description `settings()` the Python side builds its table from (flags,
// board-profile keys, help, what `generate --host` forwards). Nothing else lists the settings.
//
// Adding a setting is adding one row. A row is
//   X(type, name, default, minimum, maximum, rule, profile, output, flag, help)
// - type: bool, int, int64_t, double, std::string, or a choice (an enum declared with BMOE_CHOICE below).
// - minimum, maximum: inclusive numeric bounds; kNoLimit where there is none (ignored for text and choices).
// - rule: what the value means beyond its bounds — Rule::Plain, Rule::Auto (kAuto, shown "auto", lets the
//   engine decide), Rule::BelowMax (the maximum itself is out), Rule::PageUnit (0 or a power of two from the
//   kernel's page), Rule::FaultSpec, Rule::Endpoints, Rule::Weights, Rule::LogitBias (the text's syntax, parsed
//   here once).
// - profile: whether a board profile's `engine:` section may (Profile::Optional) or must (Profile::Required)
//   set it, or not at all (Profile::None).
// - output: Output::Exact, or Output::Lossy where a value other than the default makes the output differ from
//   the model's: the run info names such a run (`lossy`), its help says LOSSY, `bench quality` measures those
//   rows and the gates refuse them.
// - flag: kNoFlag (Python/config only), kFlag (--the-name, --x/--no-x for a bool), or a short alias ("-t")
//   given besides the long flag.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace bmoe {

constexpr double kNoLimit = std::numeric_limits<double>::infinity();  // a bound that is not there
constexpr int kAuto = -1;                                               // Rule::Auto's "auto"
constexpr const char * kNoFlag = nullptr;
constexpr const char * kFlag = "";

enum class Rule { Plain, Auto, BelowMax, PageUnit, FaultSpec, Endpoints, Weights, LogitBias };
enum class Profile { None, Optional, Required };
enum class Output { Exact, Lossy };

// A choice: an enum and the names of its values (what flags, profiles and run reports say), one list each.
template <typename T>
struct Choices;
#define BMOE_CHOICE_VALUE(value, name) value,
#define BMOE_CHOICE_NAME(value, name) name,
#define BMOE_CHOICE(Type, LIST)                                       \
    enum class Type { LIST(BMOE_CHOICE_VALUE) };                      \
    template <>                                                       \
    struct Choices<Type> {                                            \
        static constexpr const char * names[] = {LIST(BMOE_CHOICE_NAME)}; \
    };

#define BMOE_READ_PATHS(X) X(Pread, "pread") X(ODirect, "odirect")
#define BMOE_DENSE_MODES(X) X(Mmap, "mmap") X(Anon, "anon")
// Read-ahead of the next layer's predicted experts: never, every decode, or where it measurably pays.
#define BMOE_PREFETCH_MODES(X) X(Off, "off") X(Predict, "predict") X(Auto, "auto")
// Speculative decoding: none, prompt-lookup drafts, the model's own MTP heads, or the best that applies.
#define BMOE_SPECULATIVE_MODES(X) X(Off, "off") X(Ngram, "ngram") X(Mtp, "mtp") X(Auto, "auto")
// llama.cpp's repacked CPU kernels: never; for the dense weights alone; for the streamed experts too (each slice
// converted as it is read); or the experts too only where the cache holds every one of them.
#define BMOE_REPACK_MODES(X) X(Off, "off") X(Dense, "dense") X(All, "all") X(Auto, "auto")
// A switch the engine may decide itself: Auto is on where it can be (and shown as a bool or "auto").
#define BMOE_TOGGLES(X) X(Off, "off") X(On, "on") X(Auto, "auto")
BMOE_CHOICE(ReadPath, BMOE_READ_PATHS)
BMOE_CHOICE(DenseMode, BMOE_DENSE_MODES)
BMOE_CHOICE(Prefetch, BMOE_PREFETCH_MODES)
BMOE_CHOICE(Speculative, BMOE_SPECULATIVE_MODES)
BMOE_CHOICE(Repack, BMOE_REPACK_MODES)
BMOE_CHOICE(Toggle, BMOE_TOGGLES)

// The engine's settings.
#define BMOE_ENGINE_SETTINGS(X)                                                                                        \
    X(bool, stream, true, 0, 0, Rule::Plain, Profile::None, Output::Exact, kFlag, "Stream experts (default on).")      \
    X(double, cache_mb, kAuto, 0, 1e9, Rule::Auto, Profile::Required, Output::Exact, kFlag,                            \
      "Expert cache: MiB, 0 = off, or auto (what the memory limits leave; adapts to pressure).")                       \
    X(int64_t, cache_floor_mb, 1024, 0, kNoLimit, Rule::Plain, Profile::Optional, Output::Exact, kFlag,                \
      "Where the machine's memory is the limit: MiB left to other processes.")                                         \
    X(int64_t, cache_ceil_mb, 1 << 20, 0, kNoLimit, Rule::Plain, Profile::Optional, Output::Exact, kFlag,              \
      "auto: at most this.")                                                                                           \
    X(int64_t, cache_margin_mb, 64, 0, kNoLimit, Rule::Plain, Profile::Optional, Output::Exact, kFlag,                 \
      "MiB kept free under the memory limit beyond what the engine foresees.")                                         \
    X(int, page_kb, 0, 0, 1024, Rule::PageUnit, Profile::Optional, Output::Exact, kFlag,                               \
      "The mirror's page unit, KiB: a power of two from the kernel's page (0) to 1024.")                               \
    X(int, io_threads, 4, 1, 64, Rule::Plain, Profile::Required, Output::Exact, kFlag, "Read lanes.")                  \
    X(ReadPath, read_path, ReadPath::ODirect, 0, 0, Rule::Plain, Profile::Required, Output::Exact, kFlag,              \
      "pread or odirect.")                                                                                             \
    X(DenseMode, dense, DenseMode::Mmap, 0, 0, Rule::Plain, Profile::Required, Output::Exact, kFlag,                   \
      "Dense weights: mmap or anon.")                                                                                  \
    X(Repack, repack, Repack::Auto, 0, 0, Rule::Plain, Profile::Optional, Output::Exact, kFlag,                        \
      "llama.cpp's repacked CPU kernels (weights interleaved for the CPU's dot products) where the pin has a layout "  \
      "for the type and this CPU: dense = the dense weights (repacked once, at load); all = the streamed experts "     \
      "too (each slice converted as it is read); auto = all where the cache holds every expert, else dense (a slice "  \
      "read and used once costs more to convert than its kernel gives back); off = the plain kernels. A streamed "    \
      "run equals a resident run with the same kernels, bit for bit.")                                                \
    X(Toggle, overlap, Toggle::Auto, 0, 0, Rule::Plain, Profile::Required, Output::Exact, kFlag,                       \
      "I/O-compute overlap (default: on where the build has the hook and no other engine of this process uses "        \
      "it; the hook is process-wide).")                                                                                \
    X(Prefetch, prefetch, Prefetch::Auto, 0, 0, Rule::Plain, Profile::Optional, Output::Exact, kFlag,                  \
      "Read ahead: guess each next layer's experts from its router weights and read them while this layer "            \
      "computes (lossless: a wrong guess costs bandwidth, never tokens). predict = every decode; auto = where the "    \
      "drive's idle time and the guesses (counted, not read, in decodes without) say it saves time.")                  \
    X(int, threads, 0, 0, 4096, Rule::Plain, Profile::Required, Output::Exact, "-t",                                   \
      "Compute threads (0 = auto: all cores, one left to the read lanes when streaming).")                             \
    X(int, ctx, 2048, 16, 1 << 24, Rule::Plain, Profile::None, Output::Exact, "-c",                                    \
      "Context length (`generate` without it: the prompt and -n, in steps of 256, up to this).")                       \
    X(int, batch, 512, 1, 1 << 24, Rule::Plain, Profile::None, Output::Exact, kNoFlag, "Logical batch size.")          \
    X(int, parallel, 1, 1, 64, Rule::Plain, Profile::Optional, Output::Exact, kFlag,                                   \
      "Sequences in one context (serve: requests decoded together, one batch a step, each routed expert read once "    \
      "for all of them); each has the whole -c context.")                                                              \
    X(int, prefill_chunk, 128, 1, 1 << 24, Rule::Plain, Profile::Optional, Output::Exact, kFlag,                       \
      "With --parallel: prompt tokens decoded per step beside the others' next tokens (a long prompt stalls no "       \
      "stream for more than one chunk).")                                                                              \
    X(int, ubatch, 512, 1, 1 << 24, Rule::Plain, Profile::None, Output::Exact, kNoFlag, "Physical batch size.")        \
    X(Toggle, flash_attn, Toggle::Off, 0, 0, Rule::Plain, Profile::Optional, Output::Exact, kFlag,                     \
      "Flash attention: off, on, or auto (llama.cpp's: on for CPU and RPC backends; Grok refuses it). On decodes "     \
      "faster, but rounds differently with the batch's size: a reused prefix's, a batched score's or an echo's "       \
      "logprobs then differ from a fresh run's beyond the plain kernels' rounding. A streamed run equals a resident "  \
      "run with the same setting, bit for bit.")                                                                       \
    X(int, n_expert_used, kAuto, 1, 4096, Rule::Auto, Profile::None, Output::Lossy, kFlag,                             \
      "Route every token to K experts instead of the model's count (auto = the model's). The output is not "           \
      "the model's; the run info says so and gates refuse it.")                                                        \
    X(double, drop_cold, 0, 0, 1, Rule::BelowMax, Profile::None, Output::Lossy, kFlag,                                 \
      "Skip a routed expert that is not resident (cached or read ahead) and carries less than this share of "          \
      "its token's routing weight; the kept experts share the weight (0 = off). Needs a cache: a skipped slot "        \
      "points at a cached expert with weight zero.")                                                                   \
    X(Speculative, speculative, Speculative::Off, 0, 0, Rule::Plain, Profile::Optional, Output::Exact, kFlag,          \
      "Speculative decoding (greedy decoding only; identical tokens): drafts verified in one batch. ngram = "          \
      "prompt-lookup drafts; mtp = the model's own MTP (next-n) head, or --draft-model; auto = mtp where the model "   \
      "has one head or a --draft-model is given, else ngram. Drafting backs off while the model rejects the drafts.")  \
    X(int, draft_max, 8, 1, 64, Rule::Plain, Profile::Optional, Output::Exact, kFlag,                                  \
      "Speculative decoding: draft at most this many tokens.")                                                         \
    X(std::string, draft_model, "", 0, 0, Rule::Plain, Profile::None, Output::Exact, kFlag,                            \
      "Speculative decoding (mtp, auto): a separate draft model that reads the model's own KV cache (a Gemma 4 "       \
      "assistant gguf for a Gemma 4 model), loaded resident beside it.")                                               \
    X(std::string, route_trace, "", 0, 0, Rule::Plain, Profile::None, Output::Exact, kFlag,                            \
      "Write every token's routed experts, per layer, to this CSV (streaming only).")                                  \
    X(int64_t, io_timeout, 30, 0, 1000000, Rule::Plain, Profile::Optional, Output::Exact, kFlag,                       \
      "I/O deadline, seconds: a read making no progress this long fails the step (0 = wait forever).")                 \
    X(bool, verify_slices, false, 0, 0, Rule::Plain, Profile::Optional, Output::Exact, kFlag,                          \
      "Check every slice read against the model's checksums (written once by `bmoe-edge verify-model`); a "            \
      "mismatch is read again, then fails.")                                                                           \
    X(std::string, prompt_cache, "", 0, 0, Rule::Plain, Profile::None, Output::Exact, kFlag,                           \
      "Keep the KV of long prompts (a system prompt, tools) in llama.cpp state files, checked against the model "      \
      "and its settings: a directory (serve, chat: one file per prompt) or a file (generate). Another model's is "     \
      "refused.")                                                                                                      \
    X(bool, parse_special, false, 0, 0, Rule::Plain, Profile::None, Output::Exact, kFlag,                              \
      "Let prompt text name control tokens (e.g. </s>); off: a prompt is text.")                                       \
    X(std::string, fault, "", 0, 0, Rule::FaultSpec, Profile::None, Output::Exact, kNoFlag,                            \
      "Test only: corrupt:N, fail:N, short:N or hang:N garbles, fails, cuts short or stalls the Nth slice read "       \
      "(also BMOE_FAULT=...).")                                                                                        \
    X(std::string, rpc, "", 0, 0, Rule::Endpoints, Profile::None, Output::Exact, kFlag,                                \
      "llama.cpp RPC workers HOST:PORT[,HOST:PORT]: whole layers go there, resident; this machine keeps the first "    \
      "layers and streams their experts (docs/rpc.md).")                                                               \
    X(std::string, rpc_split, "", 0, 0, Rule::Weights, Profile::None, Output::Exact, kFlag,                            \
      "Layer shares W0,W1,...: this machine first, then each --rpc worker (default: by free memory).")                 \
    X(int64_t, rpc_timeout, 300, 0, 1000000, Rule::Plain, Profile::None, Output::Exact, kFlag,                         \
      "RPC: a decode waiting this many seconds on the workers ends the run with one line (a stopped worker or a "      \
      "lost network); 0 = wait forever.")                                                                              \
    X(bool, rpc_insecure, false, 0, 0, Rule::Plain, Profile::None, Output::Exact, kFlag,                               \
      "Allow --rpc workers on a non-loopback address: RPC has no authentication or encryption (docs/rpc.md).")

// How tokens are chosen. Conversations (`chat`, `serve`) sample at kConversationTemp where the user or the
// request says nothing; everything else has one default here.
#define BMOE_SAMPLING_SETTINGS(X)                                                                                      \
    X(double, temp, 0, 0, 2, Rule::Plain, Profile::None, Output::Exact, kFlag, "Temperature: 0 = greedy.")             \
    X(int, top_k, 40, 0, 1 << 20, Rule::Plain, Profile::None, Output::Exact, kFlag,                                    \
      "Keep the K most likely tokens (0 = all).")                                                                      \
    X(double, top_p, 0.95, 0, 1, Rule::Plain, Profile::None, Output::Exact, kFlag,                                     \
      "Keep the most likely tokens up to this mass.")                                                                  \
    X(double, min_p, 0.05, 0, 1, Rule::Plain, Profile::None, Output::Exact, kFlag,                                     \
      "Drop tokens less likely than this share of the most likely one (0 = off).")                                     \
    X(int64_t, seed, kAuto, 0, 4294967294.0, Rule::Auto, Profile::None, Output::Exact, kFlag,                          \
      "Sampling seed: the same seed, prompt and settings give the same text (auto = a random one each run).")          \
    X(std::string, grammar, "", 0, 0, Rule::Plain, Profile::None, Output::Exact, kNoFlag,                              \
      "GBNF with a `root` rule: only tokens it allows are sampled (empty = unconstrained).")                           \
    X(std::string, grammar_triggers, "", 0, 0, Rule::Plain, Profile::None, Output::Exact, kNoFlag,                     \
      "With a grammar: regexes, one a line; the grammar holds from the first match on (a tool call's opening), "       \
      "the text before it is free (empty = from the first token).")                                                    \
    X(std::string, grammar_prefill, "", 0, 0, Rule::Plain, Profile::None, Output::Exact, kNoFlag,                      \
      "With a grammar: text it has already seen, fed to it first (the template's opening of the answer, which a "      \
      "chat format's grammar starts with).")                                                                           \
    X(std::string, logit_bias, "", 0, 0, Rule::LogitBias, Profile::None, Output::Exact, kFlag,                         \
      "Add BIAS to the logit of token ID before sampling, greedy too: ID:BIAS[,ID:BIAS...], BIAS from -100 to 100 "    \
      "(-100 all but bans a token, 100 all but forces it).")                                                           \
    X(double, repeat_penalty, 1, 0.01, 10, Rule::Plain, Profile::None, Output::Exact, kFlag,                           \
      "llama.cpp's repeat penalty: a token seen in the penalty window has a positive logit divided by this, a "        \
      "negative one multiplied (1 = off).")                                                                            \
    X(double, presence_penalty, 0, -2, 2, Rule::Plain, Profile::None, Output::Exact, kFlag,                            \
      "Subtract this from the logit of every token seen in the penalty window (OpenAI's; 0 = off).")                   \
    X(double, frequency_penalty, 0, -2, 2, Rule::Plain, Profile::None, Output::Exact, kFlag,                           \
      "Subtract this times a token's count in the penalty window from its logit (OpenAI's; 0 = off).")                 \
    X(int, penalty_last_n, 64, -1, 1 << 24, Rule::Plain, Profile::None, Output::Exact, kFlag,                          \
      "The penalties' window: the last N tokens, prompt included, as llama-server (-1 = the whole context).")          \
    X(int, logprobs, -1, -1, 20, Rule::Plain, Profile::None, Output::Exact, kNoFlag,                                   \
      "Report each chosen token's log-probability and the N most likely tokens at its position, from the raw "         \
      "logits (log-softmax, before any sampler); -1 = none.")

constexpr double kConversationTemp = 0.8;  // llama-server's; OpenAI's 1.0 is for far larger models

// The expected CRC-32C of one expert slice: `length` bytes at `offset` of file `file` (the shard
// index). Written by `bmoe-edge verify-model` into the model's sidecar; checked with verify_slices.
struct SliceSum {
    uint32_t file = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
    uint32_t crc32c = 0;
};

#define BMOE_SETTING_FIELD(type, name, default_value, ...) type name = default_value;

struct StreamConfig {
    BMOE_ENGINE_SETTINGS(BMOE_SETTING_FIELD)
    // Not a setting: the model's slice checksums (`verify-model`'s sidecar), required with verify_slices.
    std::vector<SliceSum> slice_sums;
};

struct SamplingParams {
    BMOE_SAMPLING_SETTINGS(BMOE_SETTING_FIELD)
};

// What the bindings export for each row: the Python side's table (bmoe_edge.engine.settings) is built from it.
struct SettingInfo {
    std::string group;              // "engine" or "sampling"
    std::string name;
    std::string kind;               // bool, int, float, str, choice, toggle
    std::vector<std::string> choices;
    double minimum = -kNoLimit;
    double maximum = kNoLimit;
    bool below_max = false;         // the maximum itself is out
    bool auto_value = false;        // "auto" is a value (kAuto, or a toggle's auto)
    std::string profile;            // "", "optional" or "required"
    bool lossy = false;             // Output::Lossy: a value other than the default changes the output
    std::string flag;               // "" = none; else the long flag (--x/--no-x for a bool)
    std::string short_flag;
    std::string help;
};
std::vector<SettingInfo> settings();

// The rows' checks: bounds and rules of one setting (by name), or of every setting. Throw bmoe::Error naming it.
void check_setting(const StreamConfig & config, const std::string & name);
void check_setting(const SamplingParams & sampling, const std::string & name);
void check_settings(const StreamConfig & config);
void check_settings(const SamplingParams & sampling);

// The run info's `lossy`: each Output::Lossy row not at its default, as NAME=VALUE, comma separated ("" = none).
std::string lossy_settings(const StreamConfig & config);

// The compute threads a run decodes with: the threads row's value, its 0 (auto) resolved on `cores` cores.
int compute_threads(int threads, bool stream, int cores);

// A choice's name, and the choice a name stands for (false: no such name).
template <typename T>
const char * to_string(T value) {
    return Choices<T>::names[static_cast<int>(value)];
}
template <typename T>
bool parse_choice(const std::string & text, T & out) {
    int i = 0;
    for (const char * name : Choices<T>::names) {
        if (text == name) {
            out = static_cast<T>(i);
            return true;
        }
        ++i;
    }
    return false;
}

// The texts' syntax, parsed in one place (the rules above check with these; the engine uses them).
// Test-only fault injection: act on the Nth slice read of the engine (1-based, counted across the
// engine's life). corrupt garbles 256 bytes of the slice after the read (once: a re-read gets the
// file's bytes), fail fails the read, short reads half the slice and reports a short read, hang stalls
// the read for hang_s seconds and then does it (the engine sets hang_s: its I/O deadline plus 2 s, or
// 5 s without one). `KIND:N+` acts on every read from the Nth on (a device that keeps hanging).
#define BMOE_FAULT_KINDS(X) X(None, "none") X(Corrupt, "corrupt") X(Fail, "fail") X(Short, "short") X(Hang, "hang")
BMOE_CHOICE(FaultKind, BMOE_FAULT_KINDS)
struct FaultInjection {
    FaultKind kind = FaultKind::None;
    int64_t nth = 0;
    double hang_s = 5.0;
    bool onward = false;  // `KIND:N+`: the Nth read and every one after it
};
FaultInjection parse_fault(const std::string & spec, const std::string & what);  // "" -> none
std::string describe(const FaultInjection & fault);
std::vector<std::string> parse_endpoints(const std::string & list);  // HOST:PORT,...
std::vector<double> parse_weights(const std::string & list);         // W0,W1,... (>= 0, not all 0)
// ID:BIAS,... (ID >= 0, BIAS in [-100, 100]; "" -> none): the logit_bias row; the engine checks the ids against
// its vocabulary.
std::vector<std::pair<int32_t, float>> parse_logit_bias(const std::string & list);

}  // namespace bmoe
