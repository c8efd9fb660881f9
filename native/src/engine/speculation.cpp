// Speculative decoding's engine half: which drafts (--speculative: off, ngram, the model's MTP head,
// or auto), the draft context beside the target one, and the drafts of a step. The verify half (one
// batched decode, the greedy choices kept while they agree, the context cut back) is generation.cpp's;
// the llama.cpp MTP calls are mtp_draft.cpp's.
#include <algorithm>

#include "bmoe/error.h"
#include "engine/engine_impl.h"
#include "policy/ngram_draft.h"

namespace bmoe {

// After the target context exists, before the warm-up capture (the head's graph is captured too).
// auto: the model's head where it has one (or its --draft-model), else prompt lookup (whose policy
// stops drafting where the model rejects the drafts), except on a recurrent trunk: there prompt lookup
// would need state snapshots at every decode, for drafts that free text seldom has.
void Engine::Impl::set_up_speculation() {
    speculation = config.speculative;
    const int heads = detail::MtpDraft::heads(model.get());
    const bool assistant = !config.draft_model.empty();  // a separate draft model (Gemma 4's assistant)
    if (assistant && (speculation == Speculative::Off || speculation == Speculative::Ngram)) {
        throw Error("--draft-model drafts with --speculative mtp or auto, not " + std::string(to_string(speculation)));
    }
    if (assistant && rpc) {
        throw Error("--draft-model with RPC workers: the draft model reads the last layers' KV cache, which "
                    "would be a worker's; run it without --rpc");
    }
    // A recurrent state is cut back to the accepted drafts only from llama.cpp's per-position
    // snapshots (context_params asks for one per draft; the architectures without them get none).
    const bool recurrent = llama_model_is_recurrent(model.get()) || llama_model_is_hybrid(model.get());
    const bool rolls_back = !recurrent || llama_n_rs_seq(ctx.get()) >= static_cast<uint32_t>(config.draft_max);
    // Chained heads (more than one next-n block, Step 3.5) did not pay at the Pi 5 Gen 2 class even when
    // they agreed with the model (0.97x; a random one 0.77x: every probe feeds all the blocks, which
    // split the cache until the give-up; bench-data/2026-12-02/mtp): auto leaves them to `mtp`.
    if (speculation == Speculative::Auto) {  // on a recurrent trunk prompt lookup is not worth its snapshots
        speculation = !rolls_back                              ? Speculative::Off
                      : assistant || (heads == 1 && !rpc)      ? Speculative::Mtp
                      : recurrent                              ? Speculative::Off
                                                               : Speculative::Ngram;
    }
    if (speculation != Speculative::Off && !rolls_back) {
        throw Error("speculative decoding cannot roll back this model's context ('" + info.architecture +
                    "' keeps a recurrent state, and llama.cpp keeps no snapshots of it): run it without "
                    "--speculative (or with auto)");
    }
    if (speculation == Speculative::Mtp && assistant) {
        mtp = detail::MtpDraft::assistant(config.draft_model, ctx.get(), context_params());
    } else if (speculation == Speculative::Mtp) {
        if (heads == 0) {
            throw Error(info.model + ": the model has no MTP head (" + info.architecture +
                        ".nextn_predict_layers is 0): use --speculative ngram or auto, or give its --draft-model");
        }
        if (rpc) {
            throw Error("--speculative mtp with RPC workers: the head's layer would be placed by llama.cpp, "
                        "not streamed here; use --speculative ngram");
        }
        mtp = std::make_unique<detail::MtpDraft>(model.get(), ctx.get(), context_params());
    }
    info.speculative = to_string(speculation);
}

// The head's decodes, checked like the target's (the seam's error, overlap's drain, the trace).
detail::MtpDraft::Decode Engine::Impl::draft_decoder() {
    return [this](llama_pos first, int n, const std::function<int()> & run) { run_decode(first, n, run); };
}

// A probe's draft against the token the step decoded alone: the policy learns whether the drafter
// agrees again, as from a verify of it.
void Engine::Impl::check_probe(llama_token drafted, llama_token chosen, StepResult & out) {
    out.metrics.probed = 1;
    learn_from_drafts(1, drafted == chosen ? 1 : 0);
}

// A verify's or a probe's outcome: the policy's next length, pause or give-up, and what the drafter
// holds meanwhile (hold_drafter: a head given up on gives its cache share back, a draft model sleeps).
void Engine::Impl::learn_from_drafts(int drafted, int accepted) {
    draft_policy.update(drafted, accepted);
    if (mtp && accepted > 0) {  // a head that agrees drafts with context from now on
        mtp->keep_every_state();
    }
    hold_drafter();
}

// A new generation: a greedy one drafts again, probing first (a separate draft model woken for it; a
// head's layers cached once it agrees: hold_drafter). A sampled one drafts nothing.
void Engine::Impl::resume_drafting() {
    mtp->set_enabled(greedy);
    if (greedy) {
        hold_drafter();
    } else {
        cache_heads(false);
    }
}

// What a drafter holds is memory the cache could use: an MTP head its layers' share of the cache and
// its dense weights' pages, a separate draft model its weights' pages (a 23 MiB assistant beside a
// 320 MiB budget: a random one held throughout cost 7% more bytes per token over 192 tokens;
// bench-data/2026-12-03/mtp-assistant). So it holds them only while it drafts: a head's layers are
// cached unless its drafts are probes (a probe reads what it needs), and its pages (both kinds of
// drafter) sleep through the long pauses and once the policy gives up, and wake for the probe that
// ends a pause (a file's pages: read again). Not for a sampled generation: it drafts nothing, and the
// next greedy one would read them again.
void Engine::Impl::hold_drafter() {
    if (!mtp || !greedy) {
        return;
    }
    const bool gave_up = draft_policy.gave_up();
    cache_heads(!gave_up && !draft_policy.probing());
    if (!mtp->asleep() && (gave_up || draft_policy.paused() >= detail::DraftPolicy::kSleepDrafterPause)) {
        sleep_drafter();
    } else if (mtp->asleep() && !gave_up && draft_policy.paused() == 0) {
        wake_drafter();
    }
}

// What it gave back, an adaptive cache takes at once (adapt's hysteresis would leave it unused:
// MemoryBudget::after_release).
void Engine::Impl::sleep_drafter() {
    detail::Streamer * streamer = streaming.streamer.get();
    budget_with_drafter = streamer ? streamer->cache().budget() : 0;
    const auto release = [this] {
        mtp->sleep();
        if (memory) {
            memory->set_drafter_asleep(true);  // its pages are no longer memory still to come
        }
    };
    if (!streamer || !memory) {
        release();
        return;
    }
    const uint64_t grown = memory->after_release(budget_with_drafter, streamer->pool_held_bytes(), release);
    if (grown != budget_with_drafter) {
        streamer->set_budget(grown);
    }
}

// Back after the cache went back to the budget it had beside them: their pages cannot take the
// process over its limit.
void Engine::Impl::wake_drafter() {
    if (streaming.streamer && budget_with_drafter > 0) {
        streaming.streamer->set_budget(std::min(streaming.streamer->cache().budget(), budget_with_drafter));
    }
    if (memory) {
        memory->set_drafter_asleep(false);
    }
    mtp->wake();
}

void Engine::Impl::cache_heads(bool on) {
    if (mtp && streaming.streamer) {
        for (int h = 0; h < mtp->layers(); ++h) {
            streaming.streamer->set_layer_active(info.n_layer + h, on);
        }
    }
}

std::vector<llama_token> Engine::Impl::draft_for(llama_pos used) {
    // Greedy only (a draft cannot change what the model picks), and not on a prompt (its logits for
    // every position would cost n_vocab floats each).
    if (speculation == Speculative::Off || !greedy || pending.size() != 1) {
        return {};
    }
    const auto room = static_cast<int64_t>(config.ctx) - used - static_cast<int64_t>(pending.size());
    const int max = static_cast<int>(std::min<int64_t>({draft_policy.length(), room, config.batch - 1}));
    hold_drafter();  // a pause that ends here: a sleeping draft model's pages come back for its draft
    if (max <= 0) {
        return {};
    }
    if (speculation == Speculative::Mtp) {
        return mtp->draft(pending.front(), used, max, config.batch, draft_decoder());
    }
    std::vector<llama_token> history(in_context);
    history.insert(history.end(), pending.begin(), pending.end());
    return detail::ngram_draft(history, detail::DraftPolicy::kNgramMin, detail::DraftPolicy::kNgramMax, max);
}

}  // namespace bmoe
