// The one step (Sequences::step): every active slot advanced by one batch. A slot holding tokens a verify
// already accepted hands the next one out with no decode; a decoding slot puts its next token in, and its
// drafts where it drafts; a slot still in its prompt puts in a chunk (a lone generation its whole prompt, in as
// many llama_decode calls as the batch takes). One decode for them all: the streamer sees the batch's routed
// experts at once and reads each once for all the sequences (the union); the KV cache has a stream per
// sequence (context.cpp: not unified), so each attends over its own cells as it would alone. Then each slot
// samples, or verifies its drafts: the greedy choices kept while they agree, its sequence cut back after.
#include <algorithm>
#include <string>
#include <vector>

#include "bmoe/error.h"
#include "core/telemetry.h"
#include "engine/sequences.h"

namespace bmoe::detail {

// One slot's share of a step's batch.
struct Sequences::Part {
    int32_t slot;
    size_t n;                        // of its pending tokens
    bool sample;                     // its last pending token is in: it samples (else only a prompt chunk went in)
    std::vector<llama_token> draft;  // put in after them to verify (empty for a probe: checked, not decoded)
    bool probe = false;
    size_t first_entry = 0;          // its first token's place in the batch
    int drafted = 0, accepted = 0, probed = 0;
};

BatchStep Sequences::step() {
    try {
        return guarded("decoding", [&] { return take_step(); });
    } catch (const Error & e) {
        const std::string changed = file_.gguf().changed();  // a read error may be the file changing under us
        const std::string why = changed.empty() ? e.what() : changed;
        fail_all(why);
        throw Error(why);
    }
}

// Who is in the batch: decoding slots first (one token each), then prompts in slot order until the chunk is used
// up (a long prompt takes a chunk a step, the others' streams go on beside it). A slot without room for its
// next tokens ends (context_full).
void Sequences::plan(BatchStep & out, std::vector<Part> & parts, int32_t per_call,
                     const std::vector<bool> & handed_out) {
    const bool lone = config_.parallel == 1;
    // The prompt tokens a step of several slots takes: the batch holds every slot's next token besides, and its
    // logits come from its last call, so the batch is one call.
    int32_t room = lone ? INT32_MAX : std::max(1, std::min(config_.prefill_chunk, per_call - config_.parallel));
    int32_t n_tokens = 0;
    for (int pass = 0; pass < 2; ++pass) {
        for (size_t i = 0; i < slots_.size(); ++i) {
            Slot & s = slots_[i];
            if (!s.active || handed_out[i] || s.pending.empty() || (pass == 0) != (s.pending.size() == 1)) {
                continue;
            }
            if (s.in_context.size() + s.pending.size() > static_cast<size_t>(config_.ctx)) {
                SlotStep & full = out.slots.emplace_back();
                full.slot = static_cast<int32_t>(i);
                full.context_full = true;
                s.active = false;
                s.pending.clear();
                continue;
            }
            const size_t n = pass == 0 ? 1 : std::min(s.pending.size(), static_cast<size_t>(room));
            if (n == 0 || (!lone && n_tokens + static_cast<int32_t>(n) > per_call)) {
                continue;  // next step
            }
            if (pass == 1) {
                room -= static_cast<int32_t>(n);
            }
            parts.push_back({static_cast<int32_t>(i), n, n == s.pending.size(), {}});
            n_tokens += static_cast<int32_t>(n);
        }
    }
}

BatchStep Sequences::take_step() {
    BatchStep out;
    std::vector<bool> handed_out(slots_.size(), false);  // a slot hands out one token a step: not decoded too
    for (size_t i = 0; i < slots_.size(); ++i) {
        if (slots_[i].active && !slots_[i].accepted.empty()) {
            hand_out(static_cast<int32_t>(i), out.slots.emplace_back());
            handed_out[i] = true;
        }
    }
    const int32_t per_call = context_.batch_per_call();
    std::vector<Part> parts;
    plan(out, parts, per_call, handed_out);
    if (parts.empty()) {
        return out;
    }
    // The model must still be the file we opened: a truncated mapping would be a SIGBUS, a rewrite
    // wrong tokens. (A change during this decode is caught by the next check or by a read.)
    file_.gguf().check_unchanged();
    TokenMetrics & m = out.metrics;
    const bool lone = config_.parallel == 1;
    const uint64_t faults0 = major_faults();
    RpcWorkers * rpc = file_.rpc();
    const uint64_t net0 = rpc ? rpc->network_bytes() : 0;
    const auto t0 = Clock::now();
    streaming_.begin_step(m);
    if (RouteTrace * trace = streaming_.route_trace()) {
        trace->begin_step(lone ? slots_.front().step : batch_steps_);
    }
    batch_steps_ += lone ? 0 : 1;
    // The drafts, inside the step's time and counters (an MTP head's drafts are decodes, with reads of their own),
    // in what the batch's one call has left.
    int32_t n_tokens = 0;
    size_t prompt_tokens = 0;
    for (const Part & p : parts) {
        n_tokens += static_cast<int32_t>(p.n);
        prompt_tokens += slots_[static_cast<size_t>(p.slot)].pending.size() > 1 ? p.n : 0;
    }
    for (Part & p : parts) {
        Slot & s = slots_[static_cast<size_t>(p.slot)];
        if (s.pending.size() != 1) {
            continue;
        }
        p.draft = drafter_.draft(s, static_cast<llama_pos>(s.in_context.size()), per_call - n_tokens);
        // A probe (DraftPolicy::probing) is checked against the token this step decodes alone: a random
        // head's two-token probe verifies read 4% more bytes per token over 192 tokens than plain decoding
        // (bench-data/2026-12-03/mtp-assistant); the tokens are plain decoding's either way.
        p.probe = !p.draft.empty() && s.draft_policy.probing();
        n_tokens += p.probe ? 0 : static_cast<int32_t>(p.draft.size());
    }
    std::vector<BatchEntry> entries;
    entries.reserve(static_cast<size_t>(n_tokens));
    for (Part & p : parts) {
        const Slot & s = slots_[static_cast<size_t>(p.slot)];
        p.first_entry = entries.size();
        const bool verify = !p.draft.empty() && !p.probe;
        const auto pos0 = static_cast<llama_pos>(s.in_context.size());
        for (size_t k = 0; k < p.n; ++k) {
            entries.push_back({s.pending[k], pos0 + static_cast<llama_pos>(k), p.slot, p.sample && (verify || k + 1 == p.n)});
        }
        for (size_t k = 0; verify && k < p.draft.size(); ++k) {
            entries.push_back({p.draft[k], pos0 + static_cast<llama_pos>(p.n + k), p.slot, true});
        }
    }
    m.n_tokens = n_tokens;
    // A batch with prompt tokens writes compute buffers sized for it that no decode after it needs: room is
    // made for them first, and they go back to the cache once the prompt is in (docs/memory.md). Without it a
    // 512-token chunk beside a decode was OOM-killed under the bench's 40% cap.
    const bool prompt = prompt_tokens > 0 && streaming_.on() && streaming_.memory() && !rpc;
    if (prompt) {
        streaming_.make_room_for_prompt(n_tokens, static_cast<int>(parts.size()), context_.prompt_ubatch());
    }
    size_t last_call = 0;
    {
        const BatchThreads threads = context_.threads_for(prompt_tokens);
        const bool verifying = lone && !parts.front().draft.empty() && !parts.front().probe;
        std::vector<llama_token> call_tokens;
        context_.decode(entries, [&](size_t first, int n) {
            last_call = first;
            call_tokens.clear();
            for (size_t k = first; k < first + static_cast<size_t>(n); ++k) {
                slots_[static_cast<size_t>(entries[k].seq)].in_context.push_back(entries[k].token);
                call_tokens.push_back(entries[k].token);
            }
            if (lone) {  // the MTP head follows sequence 0 alone (drafter.h)
                drafter_.observe(slots_.front(), call_tokens.data(), n, entries[first].pos, verifying,
                                 entries[first + static_cast<size_t>(n) - 1].logits);
            }
        });
    }
    for (const Part & p : parts) {
        std::vector<llama_token> & pending = slots_[static_cast<size_t>(p.slot)].pending;
        pending.erase(pending.begin(), pending.begin() + static_cast<long>(p.n));
    }
    if (prompt) {
        m.released_bytes = streaming_.give_prompt_memory_back();
    }
    if (RouteTrace * trace = streaming_.route_trace()) {
        trace->end_step();
    }
    const size_t first_result = out.slots.size();
    for (Part & p : parts) {
        Slot & s = slots_[static_cast<size_t>(p.slot)];
        SlotStep & st = out.slots.emplace_back();
        st.slot = p.slot;
        ++out.n_sequences;
        out.n_decoding += p.n == 1 && p.sample ? 1 : 0;
        if (!p.sample) {
            continue;
        }
        // The logits are the last call's (a batch of several parts is one call, a lone prompt samples at its end).
        const auto row = static_cast<int32_t>(p.first_entry + p.n - 1 - last_call);
        llama_token token = 0;
        if (!p.draft.empty() && !p.probe) {
            token = verify(s, p, row, st.result);
        } else {
            token = llama_sampler_sample(s.sampler.get(), context_.get(), row);
            record_outputs(s, st.result.logits, st.result.logprobs, row, token);
            s.pending.assign(1, token);
            if (p.probe) {  // the policy learns whether the drafter agrees again, as from a verify of it
                p.probed = 1;
                drafter_.learn(s, 1, p.draft.front() == token ? 1 : 0);
            }
        }
        emit(s, st, token);
    }
    m.wall_ms = ms_since(t0);
    m.net_bytes = rpc ? rpc->network_bytes() - net0 : 0;
    streaming_.end_step(m, prompt, faults0);
    m.compute_ms = m.wall_ms - m.stall_ms;
    m.major_faults = major_faults() - faults0;
    m.rss_bytes = rss_bytes();
    if (out.n_decoding == out.n_sequences) {
        out.summed_bytes = static_cast<uint64_t>(out.n_decoding) * info_.routed_bytes_per_token;
    }
    for (size_t k = 0; k < parts.size(); ++k) {  // each slot's result carries the whole step's metrics
        TokenMetrics & r = out.slots[first_result + k].result.metrics;
        const int step_no = r.step;
        r = m;
        r.step = step_no;
        r.drafted = parts[k].drafted;
        r.accepted = parts[k].accepted;
        r.probed = parts[k].probed;
    }
    return out;
}

// The model's choice after the slot's last token and after each draft: drafts kept while they agree, the
// sequence cut back to them, the agreed ones handed out by the next steps without a decode.
llama_token Sequences::verify(Slot & s, Part & p, int32_t first_row, StepResult & out) {
    const size_t n_draft = p.draft.size();
    std::vector<llama_token> chosen;
    for (size_t j = 0; j <= n_draft; ++j) {
        const auto row = first_row + static_cast<int32_t>(j);
        const llama_token t = llama_sampler_sample(s.sampler.get(), context_.get(), row);
        chosen.push_back(t);
        if (j == 0) {
            record_outputs(s, out.logits, out.logprobs, row, t);
        } else {
            Slot::Verified & v = s.accepted.emplace_back();
            v.token = t;
            record_outputs(s, v.logits, v.logprobs, row, t);
        }
        if (j == n_draft || t != p.draft[j] || llama_vocab_is_eog(model_.vocab(), t)) {
            break;
        }
    }
    const size_t kept = chosen.size() - 1;  // drafts the model agreed with
    const auto cut = static_cast<llama_pos>(s.in_context.size() - (n_draft - kept));
    if (!context_.cut(p.slot, cut)) {
        throw Error("speculative decoding cannot roll back this model's context (a recurrent model?): "
                    "run it without --speculative");
    }
    s.in_context.resize(static_cast<size_t>(cut));
    if (p.slot == 0) {
        drafter_.truncate(cut);  // the head's states of the rejected drafts go too
    }
    p.drafted = static_cast<int>(n_draft);
    p.accepted = static_cast<int>(kept);
    drafter_.learn(s, p.drafted, p.accepted);
    s.pending.assign(1, chosen.back());
    return chosen.front();
}

// A token a verify already accepted: handed out with no decode.
void Sequences::hand_out(int32_t slot, SlotStep & out) {
    Slot & s = slots_[static_cast<size_t>(slot)];
    Slot::Verified v = std::move(s.accepted.front());
    s.accepted.pop_front();
    out.slot = slot;
    out.result.logits = std::move(v.logits);
    out.result.logprobs = std::move(v.logprobs);
    out.result.metrics.rss_bytes = rss_bytes();
    emit(s, out, v.token);
}

// What a step hands out besides its token, from the logits at batch row `row` (the sampler's).
void Sequences::record_outputs(const Slot & s, std::string & logits, PositionLogprobs & logprobs, int32_t row,
                               llama_token token) const {
    if (s.want_logits) {
        logits = context_.logits_bytes(row, model_.vocab());
    }
    if (s.n_logprobs >= 0) {
        logprobs = position_logprobs(context_.logits(row), model_.vocab(), token, s.n_logprobs);
    }
}

void Sequences::emit(Slot & s, SlotStep & out, llama_token token) const {
    StepResult & r = out.result;
    r.token = token;
    r.end_of_generation = llama_vocab_is_eog(model_.vocab(), token);
    if (!r.end_of_generation) {
        r.piece = token_piece(model_.vocab(), token);
    } else {  // the model ended it; the slot keeps its context for a next turn
        s.active = false;
        s.pending.clear();
        s.accepted.clear();
    }
    r.metrics.step = s.step++;
    out.produced = true;
}

}  // namespace bmoe::detail
