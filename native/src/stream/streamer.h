// The streaming policy: given the experts a layer routed to, decide what to read and what to
// evict, and make the routed slices resident before the layer's expert matmuls use them — either
// before returning (serial) or by publishing the reads and letting each compute thread wait, in
// the expert-ready hook, for the one slice it is about to multiply (overlap). Knows nothing of
// llama.cpp: tensors are (file, offset, bytes per expert) rows with an opaque identity key.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "policy/expert_cache.h"
#include "stream/counters.h"
#include "stream/used_experts.h"

namespace bmoe::detail {

class Batch;
class Mirror;
class PagePool;
class ReadLanes;
class SliceFile;
class SliceLayout;
struct ReadJob;

// One projection (gate, up, down or fused gate_up) of one layer's experts.
struct StreamedTensor {
    int layer = 0;
    int projection = 0;         // position in the recipe's suffix list: reads go projection-major
    uint32_t file = 0;
    uint64_t offset = 0;        // file offset of expert 0
    uint64_t expert_bytes = 0;  // nb[2]: one expert's slice
    int n_expert = 0;
    const void * key = nullptr; // the tensor's identity as the expert-ready hook sees it
    std::string name;           // for messages
    std::vector<uint32_t> sums; // CRC-32C per expert when slices are verified; empty = not checked
    // Not null: the slices are converted into this layout as they are read (--repack; read/slice_layout.h).
    std::shared_ptr<const SliceLayout> layout;
};

// The lanes' view of one read-ahead batch: which (tensor, expert) each job fills, whether it
// landed, and the generation under which a layer adopted it (its compute threads wait for that).
struct ReadAhead {
    std::mutex mutex;
    std::vector<std::pair<size_t, int>> targets;  // job index -> (tensor, expert)
    std::vector<uint8_t> landed;                  // 0 pending, 1 read, 2 failed
    std::vector<uint64_t> adopted;                // 0: not (yet) routed to
};

class Streamer {
public:
    // A prompt's batch reads runs of adjacent slices as one job of up to this (jobs_for).
    static constexpr uint64_t kMergeBytes = 4ULL << 20;

    // The cache starts with no budget: set_budget gives it one once memory has been measured.
    // io_timeout_s > 0: a batch making no progress that long fails the layer (Batch::wait).
    Streamer(std::vector<StreamedTensor> tensors, std::vector<SliceFile *> files, std::vector<Mirror *> mirrors,
             PagePool & pool, ReadLanes & lanes, int compute_threads, double io_timeout_s = 0);
    ~Streamer();

    // Serial: returns once every routed slice of `layer` is resident. Throws bmoe::Error if any
    // read failed; then nothing of this layer may be computed.
    void make_resident(int layer, const std::vector<int> & experts);

    // Overlap: drain the previous batch (eviction safety), publish this layer's reads, return.
    void publish(int layer, const std::vector<int> & experts);
    // The expert-ready hook: block until `expert` of the tensor with this key is resident (or the
    // batch failed, or the I/O deadline passed: then the decode is failed). Unknown keys (tensors
    // we do not stream) return at once; an expert id out of range fails the decode.
    void wait_ready(const void * key, int expert);
    // Read-ahead: `experts` (a prediction) of `layer`, the next layer to route. Those not cached are mapped and read
    // at background priority; they join the cache only if the layer routes to them (make_resident / publish adopt
    // them; the rest are cancelled or released): a guess only ever costs bandwidth and memory. count_guess: the
    // same guess only counted once the layer routes, not read (prefetch_policy.h: what auto decides from).
    void prefetch(int layer, const std::vector<int> & experts);
    void count_guess(int layer, const std::vector<int> & experts);

    // A graph that runs whole (seam.h: no layer's router isolated) where every streamed expert is resident and no
    // read is in flight or staged: meanwhile the hook only notes the experts each layer uses, and afterwards they
    // count as the router would have counted them (lookups that hit, routed bytes, the cache's use counts).
    bool holds_every_expert() const;
    void begin_whole_graph();
    void end_whole_graph();
    // Wait for the batch in flight; rethrows its error after undoing its residency.
    void drain();
    bool failed() const { return fatal_.load(std::memory_order_acquire); }
    // Before a decode: a failure of the last one (it ended the generation) must not abort this one.
    void clear_failure();

    // Each tensor's layout (in the constructor's order): its slices are converted as they are read from now on.
    // Only before the first read (nothing resident).
    void set_layouts(std::vector<std::shared_ptr<const SliceLayout>> layouts);

    // A new cache budget; a smaller one evicts at once and returns the freed pages to the kernel.
    // Only between decodes (no batch in flight).
    void set_budget(uint64_t bytes);
    // After a prompt: its batches routed to (nearly) every expert of a layer, and the layers last computed
    // hold more than their share. Evict every layer down to its share and give the pool's free pages back.
    void settle();
    // After a decode, while the budget is below what it was (memory given back to a neighbour): the free units the
    // pool keeps populated for reuse are at most a little over what the budget leaves room for, the rest go back to
    // the kernel. Otherwise the trimmed units are populated again as they are taken while evicted experts' pages
    // sit spare, and the process grows back over the memory it gave.
    void trim_spare();
    // While the engine is idle (a server between requests): populate up to `max_bytes` of the pool toward
    // the cache budget, never past `all_experts_bytes` (every streamed expert's slices: the run info's
    // expert_bytes), so the next prompt's reads land in pages that exist instead of waiting for the
    // kernel to zero fresh ones on the eval thread. Returns the bytes still to populate (0: warm).
    uint64_t warm_pool(uint64_t max_bytes, uint64_t all_experts_bytes);
    // A layer that stops running (an MTP head given up on) releases its cached experts and gives its
    // share of the budget to the others; again active when it may run again. Between decodes only.
    void set_layer_active(int layer, bool active);
    // Around a batch with prompt tokens: each routed expert counts for the cache at most once per sequence
    // of the batch (`sequences`; 0: every token counts, as in a decode, whose tokens are its sequences).
    // A prompt is one sequence's step: counted per token, its 2,048 tokens outweighed 256 decodes' worth of
    // counts, and the cache kept the prompt's experts instead of the answer's (docs/memory.md). Left set by a
    // prompt that failed, it changes nothing: a decode routes an expert at most once per sequence anyway.
    void count_uses_per_sequence(int sequences) { uses_cap_ = sequences > 0 ? sequences : kUncapped; }
    const ExpertCache & cache() const { return cache_; }
    std::vector<int> cached_experts(int layer) const {
        return layer >= 0 && layer < n_layers() && !by_layer_[static_cast<size_t>(layer)].empty() ? cache_.resident(layer)
                                                                                              : std::vector<int>();
    }
    // Resident for `layer` without a read: cached, or guessed and read ahead.
    bool resident(int layer, int expert) const {
        return layer >= 0 && layer < n_layers() && !by_layer_[static_cast<size_t>(layer)].empty() &&
               (cache_.contains({layer, expert}) || staged(layer, expert));
    }
    uint64_t pool_held_bytes() const;

    StreamCounters take_counters();
    uint64_t resident_expert_bytes() const;
    uint64_t bytes_per_expert(int layer) const;
    int n_layers() const { return static_cast<int>(by_layer_.size()); }

private:
    static constexpr int kUncapped = 1 << 30;
    int uses_cap_ = kUncapped;
    // Cache lookups, residency accounting and eviction for one layer: returns the missing experts.
    std::vector<int> admit(int layer, const std::vector<int> & routed, std::vector<int> & experts,
                           std::vector<int> & adopted);
    // `firsts` (publish, make_resident): a batch missing at least half of a layer's experts (a prompt's) reads
    // runs of adjacent experts of a projection as one job of up to kMergeBytes, and firsts[j] is job j's first
    // target (job j fills targets firsts[j] .. firsts[j + 1] - 1); without it one job per slice.
    std::vector<ReadJob> jobs_for(int layer, const std::vector<int> & missing,
                                  std::vector<std::pair<size_t, int>> * targets, std::vector<size_t> * firsts = nullptr);
    void forget(int layer, const std::vector<int> & missing);
    // After a failed wait: forget the layer's slices, or, when the batch was abandoned on its
    // deadline, quarantine them (see streamer.cpp).
    void give_up(const std::shared_ptr<Batch> & batch, int layer, const std::vector<int> & missing);
    void add_batch_counters(const Batch & batch);
    void drain_in_flight();
    void for_each_slice(int layer, int expert, bool acquire);
    void release_victims(const std::vector<ExpertKey> & victims);
    void mark_ready(size_t tensor, int expert, uint64_t generation);
    void mark_failed();
    // Read-ahead bookkeeping (streamer_ahead.cpp).
    bool staged(int layer, int expert) const;
    // The layer now routed: staged guesses it chose are adopted (in overlap, made ready under
    // `generation` as they land), the others cancelled; the batch is kept to settle later.
    void adopt_ahead(int layer, const std::vector<int> & experts, const std::vector<int> & adopted,
                     uint64_t generation);
    // Wait for the adopted read-ahead batch; release the wrong guesses; throws if an adopted read
    // failed (after forgetting it).
    void settle_ahead();
    // Drop a read-ahead the router never reached (a decode failed or ended first).
    void retire_ahead();

    std::vector<StreamedTensor> tensors_;
    std::vector<std::vector<size_t>> by_layer_;  // layer -> indexes into tensors_, projection order
    std::vector<SliceFile *> files_;
    std::vector<Mirror *> mirrors_;
    PagePool & pool_;
    ExpertCache cache_;
    ReadLanes & lanes_;
    StreamCounters counters_;
    std::unordered_set<uint64_t> routed_;  // (layer, expert) routed since the last take_counters
    int compute_threads_ = 1;
    double io_timeout_s_ = 0;
    // Batches timed out on the I/O deadline: a lane may still be in their reads, so the slices whose
    // units they hold (`experts` of `layer`) are released only once the kernel returned every read
    // (reap_abandoned). After kHangLimit deadlines in a row the engine stops (the storage keeps hanging).
    struct Abandoned {
        std::shared_ptr<Batch> batch;
        int layer = -1;
        std::vector<int> experts;
    };
    static constexpr int kHangLimit = 3;
    void abandon(const std::shared_ptr<Batch> & batch, int layer, std::vector<int> experts);
    void reap_abandoned();
    void trim_to_budget();
    std::vector<Abandoned> abandoned_;
    int timeouts_in_a_row_ = 0;
    // The budget's last move was down (memory given back): the pool's spare pages are trimmed after each decode.
    static constexpr uint64_t kSpareSlackBytes = 32ULL << 20;  // half the default --cache-margin
    bool gave_back_ = false;

    // Overlap state. Readiness per (tensor, expert) carries the generation of the batch that made
    // it resident, so flags are reused across layers and tokens without clearing.
    std::vector<std::pair<const void *, size_t>> by_key_;  // sorted by key
    std::vector<std::unique_ptr<std::atomic<uint64_t>[]>> ready_;
    std::unique_ptr<std::atomic<uint64_t>[]> wanted_;
    uint64_t generation_ = 0;
    std::shared_ptr<Batch> in_flight_;
    int in_flight_layer_ = -1;
    std::vector<int> in_flight_missing_;
    std::atomic<bool> fatal_{false};
    std::atomic<bool> whole_graph_{false};
    UsedExperts used_;  // written by the hook during a whole graph
    std::atomic<uint64_t> stall_ns_{0};
    std::mutex wait_mutex_;
    std::condition_variable wait_cv_;
    std::string wait_error_;  // under wait_mutex_: why a compute thread gave up waiting

    // Read-ahead: the guesses for the next layer (staged), then, once that layer routed, the batch
    // still landing with the guesses it adopted and the ones to release after it.
    int ahead_layer_ = -1;
    std::vector<int> ahead_predicted_;  // every guess, cached ones included (for accuracy)
    std::vector<int> ahead_staged_;     // the guesses mapped and queued for reading, sorted
    int guess_layer_ = -1; std::vector<int> guess_uncached_;  // the last guess (read or counted), its experts not cached
    std::shared_ptr<Batch> ahead_batch_;
    std::shared_ptr<ReadAhead> ahead_;
    int settle_layer_ = -1;
    std::shared_ptr<Batch> settle_batch_;
    std::shared_ptr<ReadAhead> settle_;
    std::vector<int> settle_adopted_;
    std::vector<int> settle_wrong_;
};

}  // namespace bmoe::detail
