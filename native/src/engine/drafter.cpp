// The drafter (drafter.h): which drafts --speculative resolves to, the draft context beside the target one, the
// drafts of a step, and what a drafter holds while it does not draft.
#include "engine/drafter.h"

#include <algorithm>

#include "bmoe/error.h"
#include "policy/ngram_draft.h"

namespace bmoe::detail {

// After the target context exists, before the warm-up capture (the head's graph is captured too).
// auto: the model's head where it has one (or its --draft-model), else prompt lookup (whose policy
// stops drafting where the model rejects the drafts), except on a recurrent trunk: there prompt lookup
// would need state snapshots at every decode, for drafts that free text seldom has.
Drafter::Drafter(const StreamConfig & config, const ModelSource & file, const Model & model, Context & context,
                 Streaming & streaming, RunInfo & info)
    : config_(config), context_(context), streaming_(streaming), n_layer_(info.n_layer), mode_(config.speculative) {
    Speculative & speculation = mode_;
    const int heads = MtpDraft::heads(model.get());
    const bool assistant = !config.draft_model.empty();  // a separate draft model (Gemma 4's assistant)
    const bool rpc = file.rpc() != nullptr;
    if (assistant && (speculation == Speculative::Off || speculation == Speculative::Ngram)) {
        throw Error("--draft-model drafts with --speculative mtp or auto, not " + std::string(to_string(speculation)));
    }
    // The one place --parallel meets speculation: prompt lookup drafts for every slot (each verifies its own
    // drafts in the shared batch); a head's or a draft model's context follows one sequence of the target's.
    if (config.parallel > 1 && (assistant || speculation == Speculative::Mtp)) {
        throw Error("--speculative mtp and --draft-model draft for one sequence (their draft context follows one "
                    "of the target's): with --parallel " + std::to_string(config.parallel) +
                    " requests draft by prompt lookup (--speculative ngram or auto)");
    }
    if (assistant && rpc) {
        throw Error("--draft-model with RPC workers: the draft model reads the last layers' KV cache, which "
                    "would be a worker's; run it without --rpc");
    }
    // A recurrent state is cut back to the accepted drafts only from llama.cpp's per-position
    // snapshots (context_params asks for one per draft; the architectures without them get none).
    const bool recurrent = model.recurrent();
    const bool rolls_back = !recurrent || llama_n_rs_seq(context.get()) >= static_cast<uint32_t>(config.draft_max);
    // Chained heads (more than one next-n block, Step 3.5) did not pay at the Pi 5 Gen 2 class even when
    // they agreed with the model (0.97x; a random one 0.77x: every probe feeds all the blocks, which
    // split the cache until the give-up; bench-data/2026-12-02/mtp): auto leaves them to `mtp`.
    if (speculation == Speculative::Auto) {  // on a recurrent trunk prompt lookup is not worth its snapshots
        speculation = !rolls_back                              ? Speculative::Off
                      : assistant || (heads == 1 && !rpc && config.parallel == 1) ? Speculative::Mtp
                      : recurrent                              ? Speculative::Off
                                                               : Speculative::Ngram;
    }
    if (speculation != Speculative::Off && !rolls_back) {
        throw Error("speculative decoding cannot roll back this model's context ('" + info.architecture +
                    "' keeps a recurrent state, and llama.cpp keeps no snapshots of it): run it without "
                    "--speculative (or with auto)");
    }
    if (speculation == Speculative::Mtp && assistant) {
        mtp_ = MtpDraft::assistant(config.draft_model, context.get(), context.params());
    } else if (speculation == Speculative::Mtp) {
        if (heads == 0) {
            throw Error(info.model + ": the model has no MTP head (" + info.architecture +
                        ".nextn_predict_layers is 0): use --speculative ngram or auto, or give its --draft-model");
        }
        if (rpc) {
            throw Error("--speculative mtp with RPC workers: the head's layer would be placed by llama.cpp, "
                        "not streamed here; use --speculative ngram");
        }
        mtp_ = std::make_unique<MtpDraft>(model.get(), context.get(), context.params());
    }
    info.speculative = to_string(speculation);
}

// The head's decodes, checked like the target's (the seam's error, overlap's drain, the trace).
MtpDraft::Decode Drafter::decoder() {
    return [this](llama_pos first, int n, const std::function<int()> & run) { context_.run_decode(first, n, run); };
}

void Drafter::begin(Slot & slot) {
    // An MTP head's or a draft model's drafts are probed first (its agreement is the drafter's; a prompt
    // lookup's is its match's) and given up on (kMtpFirstProbes, kMtpGiveUp).
    const bool mtp_drafts = mode_ == Speculative::Mtp;
    slot.draft_policy = DraftPolicy(config_.draft_max, mtp_drafts ? DraftPolicy::kMtpGiveUp : 0,
                                    mtp_drafts ? DraftPolicy::kMtpFirstProbes : 0);
    if (mtp_) {  // a new generation: the head drafts again (greedy only)
        mtp_->set_enabled(slot.greedy);
        if (slot.greedy) {
            hold(slot);
        } else {
            cache_heads(false);
        }
    }
}

// A verify's or a probe's outcome: the policy's next length, pause or give-up, and what the drafter
// holds meanwhile (hold: a head given up on gives its cache share back, a draft model sleeps).
void Drafter::learn(Slot & slot, int drafted, int accepted) {
    slot.draft_policy.update(drafted, accepted);
    if (mtp_ && accepted > 0) {  // a head that agrees drafts with context from now on
        mtp_->keep_every_state();
    }
    hold(slot);
}

// What a drafter holds is memory the cache could use: an MTP head its layers' share of the cache and
// its dense weights' pages, a separate draft model its weights' pages (a 23 MiB assistant beside a
// 320 MiB budget: a random one held throughout cost 7% more bytes per token over 192 tokens;
// bench-data/2026-12-03/mtp-assistant). So it holds them only while it drafts: a head's layers are
// cached unless its drafts are probes (a probe reads what it needs), and its pages (both kinds of
// drafter) sleep through the long pauses and once the policy gives up, and wake for the probe that
// ends a pause (a file's pages: read again). Not for a sampled generation: it drafts nothing, and the
// next greedy one would read them again.
void Drafter::hold(const Slot & slot) {
    if (!mtp_ || !slot.greedy) {
        return;
    }
    const DraftPolicy & policy = slot.draft_policy;
    const bool gave_up = policy.gave_up();
    cache_heads(!gave_up && !policy.probing());
    if (!mtp_->asleep() && (gave_up || policy.paused() >= DraftPolicy::kSleepDrafterPause)) {
        sleep();
    } else if (mtp_->asleep() && !gave_up && policy.paused() == 0) {
        wake();
    }
}

// What it gave back, an adaptive cache takes at once (adapt's hysteresis would leave it unused:
// MemoryBudget::after_release).
void Drafter::sleep() {
    Streamer * streamer = streaming_.streamer();
    MemoryBudget * memory = streaming_.memory();
    budget_with_drafter_ = streamer ? streamer->cache().budget() : 0;
    const auto release = [this, memory] {
        mtp_->sleep();
        if (memory) {
            memory->set_drafter_asleep(true);  // its pages are no longer memory still to come
        }
    };
    if (!streamer || !memory) {
        release();
        return;
    }
    const uint64_t grown = memory->after_release(budget_with_drafter_, streamer->pool_held_bytes(), release);
    if (grown != budget_with_drafter_) {
        streamer->set_budget(grown);
    }
}

// Back after the cache went back to the budget it had beside them: their pages cannot take the
// process over its limit.
void Drafter::wake() {
    Streamer * streamer = streaming_.streamer();
    if (streamer && budget_with_drafter_ > 0) {
        streamer->set_budget(std::min(streamer->cache().budget(), budget_with_drafter_));
    }
    if (MemoryBudget * memory = streaming_.memory()) {
        memory->set_drafter_asleep(false);
    }
    mtp_->wake();
}

// Whether the MTP head's layers (every chained block) keep a share of the expert cache.
void Drafter::cache_heads(bool on) {
    if (mtp_ && streaming_.streamer()) {
        for (int h = 0; h < mtp_->layers(); ++h) {
            streaming_.streamer()->set_layer_active(n_layer_ + h, on);
        }
    }
}

std::vector<llama_token> Drafter::draft(Slot & slot, llama_pos used, int room) {
    // Greedy only (a draft cannot change what the model picks), and not on a prompt (its logits for
    // every position would cost n_vocab floats each).
    if (mode_ == Speculative::Off || !slot.greedy || slot.pending.size() != 1) {
        return {};
    }
    const auto ctx_room = static_cast<int64_t>(config_.ctx) - used - static_cast<int64_t>(slot.pending.size());
    const int max = static_cast<int>(std::min<int64_t>({slot.draft_policy.length(), ctx_room, room}));
    hold(slot);  // a pause that ends here: a sleeping draft model's pages come back for its draft
    if (max <= 0) {
        return {};
    }
    if (mode_ == Speculative::Mtp) {
        return mtp_->draft(slot.pending.front(), used, max, config_.batch, decoder());
    }
    std::vector<llama_token> history(slot.in_context);
    history.insert(history.end(), slot.pending.begin(), slot.pending.end());
    return ngram_draft(history, DraftPolicy::kNgramMin, DraftPolicy::kNgramMax, max);
}

// The hidden states the head drafts from: kept only while it may draft (greedy, not given up, at most
// kMtpResumeFeed decodes before a pause ends), else they would pile up to the context's length; it restarts
// after such a gap.
void Drafter::observe(const Slot & slot, const llama_token * tokens, int n, llama_pos first, bool every_row_out,
                      bool last_row_out) {
    const DraftPolicy & policy = slot.draft_policy;
    if (mtp_ && slot.greedy && !policy.gave_up() && policy.paused() < DraftPolicy::kMtpResumeFeed) {
        mtp_->observe(tokens, n, first, every_row_out, last_row_out);
    }
}

void Drafter::truncate(llama_pos n) {
    if (mtp_) {
        mtp_->truncate(n);
    }
}

void Drafter::clear() {
    if (mtp_) {
        mtp_->clear();
    }
}

}  // namespace bmoe::detail
