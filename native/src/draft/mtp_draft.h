// The model's own draft head (MTP, "next-n" layers): the one place that speaks llama.cpp's MTP API.
//
// A model with `<arch>.nextn_predict_layers` > 0 carries, after its trunk, a block that predicts the
// token after next from the trunk's hidden state and the next token's embedding. llama.cpp runs it
// in a second context over the same model, of type LLAMA_CONTEXT_TYPE_MTP: its graph is the head
// alone (its own KV cache holds only the head's layer), its input a token plus, as that token's
// embedding row, the target's hidden state one position earlier (`h_nextn`, read from the target
// with the staging API of src/llama-ext.h, which the pin's common/speculative.cpp uses the same
// way). The draft context is made with the target's own parameters, eval callback included, so the
// seam sees the head's MoE layer and its experts stream like any other layer's.
//
// Greedy, one head (qwen35moe/glm4moe/deepseek-style `graph_mtp`): once it has agreed with the model
// (before, it drafts from the target's latest state alone: keep_every_state), the head is fed every
// position the target decoded (lazily, in one batch before the next draft), then drafts token after token,
// its own hidden state carried to the next; the draft positions are removed again before the target
// verifies. Chained heads (a model with several next-n blocks, Step 3.5): one trained block per draft
// step, chosen with llama_set_nextn_layer_offset, as the pin's common/speculative.cpp does: every
// block is fed the target's positions, and draft step i runs block i over the whole draft prefix
// (each block's KV is its own layer's), so a step drafts at most as many tokens as there are blocks.
// A separate draft model that shares the target's KV (Gemma 4's assistant, `--draft-model`): a small
// dense model, mapped here, whose context (type MTP, `ctx_other` = the target) has no KV of
// its own: its layers' queries attend over the target's last two layers' keys and values. Nothing is
// fed; every draft token is decoded at the target's next position with the assistant's own hidden
// state carried (the pin's driver and the Transformers reference do the same), and the target's verify
// cut is the assistant's too. What the engine decodes on the draft context goes through `Decode` (the
// engine's seam errors, overlap drain, route trace): this class never reads an expert itself.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "llama-cpp.h"  // llama.h, and its owning pointers

namespace bmoe::detail {

// Bytes of a file mapping that only the drafter reads (a separate draft model's weights, an in-file
// head's dense tensors): clean file pages, dropped while it sleeps and read again when touched.
struct DrafterPages {
    std::string file;
    void * data = nullptr;
    uint64_t bytes = 0;
    uint64_t file_offset = 0;  // of the byte at `data`
};

class MtpDraft {
public:
    // Runs `run` (one llama_decode/llama_process of `n` tokens from position `first` on the draft
    // context) the engine's way; throws bmoe::Error on failure.
    using Decode = std::function<void(llama_pos first, int n, const std::function<int()> & run)>;

    // The model's MTP heads (0: none, or loaded without them).
    static int heads(const llama_model * model);

    // `params`: the target context's parameters (cb_eval and all); throws bmoe::Error when llama.cpp
    // cannot make an MTP context for this model. Switches the target to output its hidden states.
    MtpDraft(llama_model * model, llama_context * target, llama_context_params params);
    // A separate draft model sharing the target's KV, from its file (`--draft-model`): checked against
    // the target (its architecture's assistant, the same hidden size and vocabulary), mapped (resident
    // once it has decoded), its context made without the target's eval callback (none of it streams).
    static std::unique_ptr<MtpDraft> assistant(const std::string & path, llama_context * target,
                                               llama_context_params params);
    ~MtpDraft();
    MtpDraft(const MtpDraft &) = delete;
    MtpDraft & operator=(const MtpDraft &) = delete;

    // The draft context's abort callback (overlap: a failed read stops its graph), kept for a context made
    // again after a sleep.
    void set_abort_callback(ggml_abort_callback abort, void * data);
    // The head layers the draft context runs (1, or every block when they chain): layers
    // n_layer .. n_layer + layers() - 1, whose experts the streamer caches beside the trunk's.
    // None for a separate draft model (resident, dense).
    int layers() const { return shared_ ? 0 : chained_ ? heads_ : 1; }

    // What the drafter alone reads of a file mapping: a separate draft model's whole file (found at
    // creation), an in-file head's dense tensors (given by the engine once the seam captured them; its
    // experts are the cache's). While its drafts are not wanted (a long pause, the policy given up)
    // `sleep` drops those pages, so the cache can grow into that memory; `wake` asks them back (read
    // ahead; a draft decode faults in what is not there yet). An in-file head's context goes too (its
    // KV, compute buffers and graph metadata: 6 MiB on the 24-layer fixture; its KV restarts after a
    // pause anyway) and is made again on waking; a separate draft model's stays: a new one would reset
    // the target's KV cells (the pin's shared cache).
    // Pieces of one mapping (the same file, the same address less offset) merge into one span, the gaps
    // between them included: a head's layer is contiguous in its file, its experts (the gaps) no longer
    // read through the mapping, and a span's whole pages are many more than its tensors' one by one.
    void set_own_pages(std::vector<DrafterPages> pages);
    void sleep();
    void wake();
    bool asleep() const { return asleep_; }
    bool separate_model() const { return shared_; }

    // Whether the target outputs the hidden states the head needs (off: sampled decoding, no drafts).
    void set_enabled(bool on);
    // Which: at first only those of the tokens whose logits are asked for (a decode's, a verify's, a
    // prompt's last), so a prompt's last layer computes its last token alone, as without a head, and
    // only the latest is kept: the head drafts from the target's last state with nothing fed, and a
    // probe reads one token's experts (a random head's first probe had fed the 17-token prompt through
    // its layer: 18 routed tokens, 25 MiB). Once an in-file head has agreed with the model, every
    // position's (a prompt's too), all fed: the context it drafts with, worth a prompt's last layer
    // over all its tokens. A separate draft model never needs more (nothing is fed).
    void keep_every_state();

    // One decode with a zero hidden state (the engine's warm-up capture, after the target decoded `token`
    // at 0); leaves the context empty.
    void warm_up(llama_token token, const Decode & decode);

    // The target just decoded `n` tokens from position `first` (`every_row_out`: with every logit
    // asked for, a verify; `last_row_out`: the last one's): their hidden states are kept until the head is
    // fed. A gap (a loaded state, a failed decode) restarts the head's context there; before
    // keep_every_state, every batch but a verify restarts it after the batch, from its last state (a
    // prompt's batch before its last has none: the last one restarts it).
    void observe(const llama_token * tokens, int n, llama_pos first, bool every_row_out, bool last_row_out);
    // The target context now holds positions [0, n) only.
    void truncate(llama_pos n);
    void clear();

    // Up to `max` greedy drafts after `last`, the token at position `pos` (the target's next one).
    std::vector<llama_token> draft(llama_token last, llama_pos pos, int max, int batch, const Decode & decode);

private:
    MtpDraft(llama_model_ptr own, llama_model * model, llama_context * target, llama_context_params params,
             std::string path);

    void make_context();
    void ask_target_states();
    // The target's hidden state of row `i` of its last batch; throws when llama.cpp gave none.
    const float * target_state(int i) const;
    void restart_after(llama_pos next, const float * state);
    void feed(int batch, const Decode & decode);
    void decode_rows(const llama_token * tokens, const float * rows, int n, llama_pos first, bool output,
                     const Decode & decode);
    // Chained heads: block `head` is what the next decode runs, its positions from `from` on cleared first.
    void select_head(int head, llama_pos from);

    llama_model_ptr own_model_;  // a separate draft model (freed after its context: declared before it)
    llama_model * model_ = nullptr;
    llama_context * target_;
    llama_context_params params_{};
    ggml_abort_callback abort_ = nullptr;
    void * abort_data_ = nullptr;
    llama_context_ptr ctx_;         // none while an in-file head sleeps
    const llama_vocab * vocab_;
    size_t n_embd_;
    int heads_;
    bool chained_;
    bool shared_;                      // a separate draft model over the target's KV: nothing fed
    std::string path_;                 // ... its file
    std::vector<DrafterPages> pages_;
    bool asleep_ = false;
    bool enabled_ = true;
    bool every_state_ = false;         // keep_every_state
    llama_pos base_ = 0;               // the head's context holds positions [0, base_)
    std::vector<llama_token> unfed_;   // tokens at base_, base_ + 1, ... the target decoded since
    std::vector<float> hidden_;        // the target's hidden states at base_ - 1, base_, ... (zeros before 0)
};

}  // namespace bmoe::detail
