// Speculative decoding's drafts, behind one interface: prompt lookup (n-gram, policy/ngram_draft) for any
// slot, or the model's MTP head / a separate draft model (draft/mtp_draft) for a lone generation; which one
// --speculative resolves to is decided here, once, at open. A generation's DraftPolicy (lengths, pauses,
// give-up) lives in its slot; what a drafter holds (a head's cache share, a draft model's pages) only while it
// drafts. The verify of the drafts is the step's (step.cpp).
#pragma once

#include <memory>
#include <vector>

#include "bmoe/config.h"
#include "bmoe/metrics.h"
#include "draft/mtp_draft.h"
#include "engine/context.h"
#include "engine/model.h"
#include "engine/slot.h"
#include "engine/streaming.h"

namespace bmoe::detail {

class Drafter {
public:
    // After the target context, before the warm-up capture (a head's graph is captured too). Refuses what cannot
    // draft here (a recurrent trunk without snapshots, an MTP head on RPC workers or beside --parallel's
    // sequences); auto picks the head, prompt lookup, or nothing.
    Drafter(const StreamConfig & config, const ModelSource & file, const Model & model, Context & context,
            Streaming & streaming, RunInfo & info);
    Drafter(const Drafter &) = delete;
    Drafter & operator=(const Drafter &) = delete;

    Speculative mode() const { return mode_; }
    MtpDraft * mtp() const { return mtp_.get(); }

    // A new generation in `slot`: its policy, and (greedy) the head drafting again, a sleeping model woken.
    void begin(Slot & slot);
    // Up to `room` drafts after the slot's one pending token at position `used` (none for a sampled generation,
    // a prompt, a paused or given-up policy). Inside the step's time: a head's drafts are decodes.
    std::vector<llama_token> draft(Slot & slot, llama_pos used, int room);
    // The target decoded `n` of the slot's tokens from `first` (`every_row_out`: a verify; `last_row_out`: the
    // last token's logits asked for): the head's states.
    void observe(const Slot & slot, const llama_token * tokens, int n, llama_pos first, bool every_row_out,
                 bool last_row_out);
    // A verify's or a probe's outcome: the policy's next length, pause or give-up, and what the drafter holds.
    void learn(Slot & slot, int drafted, int accepted);
    // The target context now holds positions [0, n) of sequence 0 only (or nothing).
    void truncate(llama_pos n);
    void clear();

private:
    void hold(const Slot & slot);
    void sleep();
    void wake();
    void cache_heads(bool on);
    MtpDraft::Decode decoder();

    const StreamConfig & config_;
    Context & context_;
    Streaming & streaming_;
    int n_layer_ = 0;
    Speculative mode_ = Speculative::Off;  // what --speculative resolved to (never Auto)
    std::unique_ptr<MtpDraft> mtp_;        // over the target context; its own freed first
    uint64_t budget_with_drafter_ = 0;     // the cache's budget when the drafter last went to sleep
};

}  // namespace bmoe::detail
