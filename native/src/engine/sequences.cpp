// --parallel: several generations in one context, one sequence each, advanced by one llama_decode per
// step. The KV cache has a stream per sequence (engine.cpp: not unified), so each sequence's attention
// runs over its own cells as it would alone; the streamer sees the batch's routed experts at once and
// reads each of them once for all the sequences (the union).
#include <algorithm>
#include <string>
#include <vector>

#include "bmoe/error.h"
#include "engine/engine_impl.h"
#include "core/telemetry.h"

namespace bmoe {

using detail::Clock;
using detail::ms_since;

namespace {

// One step's batch: tokens of several sequences, logits only where a slot samples.
struct SlotBatch {
    llama_batch batch;
    explicit SlotBatch(int32_t capacity) : batch(llama_batch_init(capacity, 0, 1)) {}
    ~SlotBatch() { llama_batch_free(batch); }
    SlotBatch(const SlotBatch &) = delete;
    SlotBatch & operator=(const SlotBatch &) = delete;
    void add(llama_token token, llama_pos pos, llama_seq_id seq, bool logits) {
        const int32_t i = batch.n_tokens++;
        batch.token[i] = token;
        batch.pos[i] = pos;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = seq;
        batch.logits[i] = logits ? 1 : 0;
    }
};

// The streamer's counters of one step, as the single-sequence step reports them (generation.cpp).
void fill_stream_metrics(TokenMetrics & m, const detail::StreamCounters & c) {
    m.io_ms = c.io_ms;
    m.stall_ms = c.stall_ms;
    m.drain_ms = c.drain_ms;
    m.bytes_read = c.storage_bytes;
    m.slice_bytes = c.slice_bytes;
    m.copy_bytes = c.copy_bytes;
    m.cache_lookups = c.lookups;
    m.cache_hits = c.hits;
    m.evictions = c.evictions;
    m.rereads = c.rereads;
    m.predicted = c.predicted;
    m.predicted_correct = c.predicted_correct;
    m.ahead_bytes = c.ahead_bytes;
    m.ahead_wasted_bytes = c.ahead_wasted_bytes;
    m.routed_bytes = c.routed_bytes;
}

}  // namespace

void Engine::Impl::forget_slots() {
    llama_memory_t memory = ctx ? llama_get_memory(ctx.get()) : nullptr;
    for (size_t s = 0; s < slots.size(); ++s) {
        if (memory != nullptr && s > 0 && !slots[s].in_context.empty()) {
            llama_memory_seq_rm(memory, static_cast<llama_seq_id>(s), -1, -1);
        }
        slots[s] = detail::Slot{};
    }
}

int32_t Engine::n_slots() const { return live().config.parallel; }

namespace {
detail::Slot & slot_of(std::vector<detail::Slot> & slots, int parallel, int32_t slot) {
    if (slot < 0 || slot >= parallel) {
        throw Error("slot " + std::to_string(slot) + " does not exist (--parallel " + std::to_string(parallel) +
                    ": slots 0 to " + std::to_string(parallel - 1) + ")");
    }
    slots.resize(static_cast<size_t>(parallel));
    return slots[static_cast<size_t>(slot)];
}
}  // namespace

int32_t Engine::slot_begin(int32_t slot, const std::vector<int32_t> & prompt, const SamplingParams & sampling,
                           bool want_logits, bool reuse_kv) {
    Impl & d = live();
    detail::Slot & s = slot_of(d.slots, d.config.parallel, slot);
    detail::check_tokens(d.vocab, prompt, "the prompt");
    std::unique_ptr<llama_sampler, detail::SamplerDeleter> chain = d.sampler_for(sampling, prompt);
    if (slot == 0) {  // sequence 0 is begin()'s too: it no longer holds what begin() left there
        d.in_context.clear();
        d.pending.clear();
        d.accepted.clear();
        d.accepted_outputs.clear();
    }
    llama_memory_t memory = llama_get_memory(d.ctx.get());
    size_t keep = detail::reusable_prefix(s.in_context, prompt, reuse_kv);
    if (!llama_memory_seq_rm(memory, slot, static_cast<llama_pos>(keep), -1)) {
        llama_memory_seq_rm(memory, slot, -1, -1);  // a recurrent state cannot be cut: afresh
        keep = 0;
    }
    s.in_context.resize(keep);
    s.pending.assign(prompt.begin() + static_cast<long>(keep), prompt.end());
    s.sampler = std::move(chain);
    s.want_logits = want_logits;
    s.n_logprobs = sampling.logprobs;
    s.step = 0;
    s.active = true;
    return static_cast<int32_t>(keep);
}

void Engine::slot_stop(int32_t slot) {
    Impl & d = live();
    detail::Slot & s = slot_of(d.slots, d.config.parallel, slot);
    s.active = false;
    s.pending.clear();
    s.sampler.reset();
}

void Engine::slot_clear(int32_t slot) {
    Impl & d = live();
    slot_stop(slot);
    llama_memory_seq_rm(llama_get_memory(d.ctx.get()), slot, -1, -1);
    d.slots[static_cast<size_t>(slot)].in_context.clear();
}

const std::vector<int32_t> & Engine::slot_tokens(int32_t slot) const {
    Impl & d = live();
    return slot_of(d.slots, d.config.parallel, slot).in_context;
}

bool Engine::slot_active(int32_t slot) const {
    Impl & d = live();
    return slot_of(d.slots, d.config.parallel, slot).active;
}

BatchStep Engine::step_slots() {
    Impl & d = live();
    d.slots.resize(static_cast<size_t>(d.config.parallel));
    BatchStep out;
    // Decoding slots first (one token each), then prompts in slot order until the chunk is used up: a
    // long prompt takes a chunk a step, the others' streams go on beside it.
    struct Part {
        int32_t slot;
        size_t n;
        bool sample;
    };
    std::vector<Part> parts;
    // The prompt tokens this step takes: the batch holds every slot's next token besides.
    int32_t room = std::max(1, std::min(d.config.prefill_chunk, d.config.batch - d.config.parallel));
    int32_t n_tokens = 0;
    for (int pass = 0; pass < 2; ++pass) {
        for (size_t i = 0; i < d.slots.size(); ++i) {
            detail::Slot & s = d.slots[i];
            if (!s.active || s.pending.empty() || (pass == 0) != (s.pending.size() == 1)) {
                continue;
            }
            const size_t n = pass == 0 ? 1 : std::min(s.pending.size(), static_cast<size_t>(room));
            if (n == 0) {
                continue;
            }
            if (s.in_context.size() + s.pending.size() > static_cast<size_t>(d.config.ctx)) {
                SlotStep & full = out.slots.emplace_back();
                full.slot = static_cast<int32_t>(i);
                full.context_full = true;
                s.active = false;
                s.pending.clear();
                continue;
            }
            if (pass == 1) {
                room -= static_cast<int32_t>(n);
            }
            parts.push_back({static_cast<int32_t>(i), n, n == s.pending.size()});
            n_tokens += static_cast<int32_t>(n);
        }
    }
    if (parts.empty()) {
        return out;
    }
    d.gguf->check_unchanged();
    SlotBatch b(n_tokens);
    std::vector<int32_t> logit_index(d.slots.size(), -1);
    for (const Part & p : parts) {
        detail::Slot & s = d.slots[static_cast<size_t>(p.slot)];
        for (size_t k = 0; k < p.n; ++k) {
            const bool last = k + 1 == p.n && p.sample;
            if (last) {
                logit_index[static_cast<size_t>(p.slot)] = b.batch.n_tokens;
            }
            b.add(s.pending[k], static_cast<llama_pos>(s.in_context.size() + k), p.slot, last);
        }
        ++out.n_sequences;
        out.n_decoding += s.pending.size() == 1 ? 1 : 0;
    }
    TokenMetrics & m = out.metrics;
    m.n_tokens = n_tokens;
    // A step with a prompt chunk writes compute buffers sized for it that the decodes after it do not need:
    // room is made first and they go back to the cache after it, as the single sequence's prompt does
    // (generation.cpp, docs/memory.md). Without it a 512-token chunk beside a decode was OOM-killed under the
    // bench's 40% cap.
    const bool chunk = out.n_decoding < out.n_sequences && d.streaming.streamer && d.memory && !d.rpc;
    if (chunk) {
        d.make_room_for_prompt(n_tokens, out.n_sequences);
    }
    const uint64_t faults0 = detail::major_faults();
    const auto t0 = Clock::now();
    if (d.streaming.streamer) {
        d.streaming.streamer->take_counters();
    }
    if (d.prefetch) {
        m.read_ahead = d.prefetch->reads_ahead();
        d.seam->set_reading_ahead(m.read_ahead);
    }
    if (d.route_trace) {
        d.route_trace->begin_step(d.slot_steps);
    }
    ++d.slot_steps;
    try {
        d.run_decode(0, n_tokens, [&] { return llama_decode(d.ctx.get(), b.batch); });
        if (d.route_trace) {
            d.route_trace->end_step();
        }
    } catch (...) {
        // Keys and values of a half-decoded batch: nobody can vouch for them, in any slot.
        llama_memory_clear(llama_get_memory(d.ctx.get()), true);
        d.forget_slots();
        d.in_context.clear();
        throw;
    }
    if (chunk) {
        m.released_bytes = d.give_prompt_memory_back();
    }
    for (const Part & p : parts) {
        detail::Slot & s = d.slots[static_cast<size_t>(p.slot)];
        s.in_context.insert(s.in_context.end(), s.pending.begin(), s.pending.begin() + static_cast<long>(p.n));
        s.pending.erase(s.pending.begin(), s.pending.begin() + static_cast<long>(p.n));
        SlotStep & step = out.slots.emplace_back();
        step.slot = p.slot;
        if (!p.sample) {
            continue;
        }
        const int32_t index = logit_index[static_cast<size_t>(p.slot)];
        StepResult & r = step.result;
        const llama_token token = llama_sampler_sample(s.sampler.get(), d.ctx.get(), index);
        if (s.want_logits) {
            const float * logits = llama_get_logits_ith(d.ctx.get(), index);
            r.logits.assign(reinterpret_cast<const char *>(logits),
                            static_cast<size_t>(llama_vocab_n_tokens(d.vocab)) * sizeof(float));
        }
        if (s.n_logprobs >= 0) {
            r.logprobs = detail::position_logprobs(llama_get_logits_ith(d.ctx.get(), index), d.vocab, token,
                                                   s.n_logprobs);
        }
        r.token = token;
        r.end_of_generation = llama_vocab_is_eog(d.vocab, token);
        if (!r.end_of_generation) {
            char buf[256];
            const int32_t n = llama_token_to_piece(d.vocab, token, buf, sizeof(buf), 0, false);
            r.piece.assign(buf, static_cast<size_t>(std::max(n, 0)));
            s.pending.assign(1, token);
        } else {
            s.active = false;  // the model ended it; the slot keeps its context for a next turn
        }
        r.metrics.step = s.step++;
        step.produced = true;
    }
    m.wall_ms = ms_since(t0);
    if (d.prefetch && n_tokens == 1) {
        d.prefetch->record(m.wall_ms);
    }
    if (d.streaming.streamer) {
        detail::Streamer & streamer = *d.streaming.streamer;
        fill_stream_metrics(m, streamer.take_counters());
        m.dropped = d.seam->take_dropped();
        m.resident_expert_bytes = streamer.resident_expert_bytes();
        const uint64_t budget = streamer.cache().budget();
        // A chunk's step was rebased just now (and its major faults are first reads of the dense weights).
        const uint64_t adapted = d.memory && !chunk ? d.memory->adapt(budget, streamer.pool_held_bytes(),
                                                                      detail::major_faults() - faults0)
                                                    : budget;
        if (adapted != budget) {
            streamer.set_budget(adapted);
        } else if (!chunk) {
            streamer.trim_spare();
        }
        m.cache_budget_bytes = adapted;
        m.pool_bytes = streamer.pool_held_bytes();
    }
    m.compute_ms = m.wall_ms - m.stall_ms;
    m.major_faults = detail::major_faults() - faults0;
    m.rss_bytes = detail::rss_bytes();
    if (out.n_decoding == out.n_sequences) {
        out.summed_bytes = static_cast<uint64_t>(out.n_decoding) * d.info.routed_bytes_per_token;
    }
    for (SlotStep & step : out.slots) {
        const int step_no = step.result.metrics.step;
        step.result.metrics = m;
        step.result.metrics.step = step_no;
    }
    return out;
}

}  // namespace bmoe
