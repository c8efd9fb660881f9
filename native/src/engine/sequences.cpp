// The slots (sequences.h): begun, stopped, forgotten. The step that advances them is step.cpp.
#include "engine/sequences.h"

#include "bmoe/error.h"

namespace bmoe::detail {

Sequences::Sequences(const StreamConfig & config, const ModelSource & file, const Model & model, Context & context,
                     Streaming & streaming, Drafter & drafter, const RunInfo & info)
    : config_(config), file_(file), model_(model), context_(context), streaming_(streaming), drafter_(drafter),
      info_(info), slots_(static_cast<size_t>(config.parallel)) {}

Slot & Sequences::at(int32_t slot) {
    if (slot < 0 || slot >= config_.parallel) {
        throw Error("slot " + std::to_string(slot) + " does not exist (--parallel " + std::to_string(config_.parallel) +
                    ": slots 0 to " + std::to_string(config_.parallel - 1) + ")");
    }
    return slots_[static_cast<size_t>(slot)];
}

int32_t Sequences::begin(int32_t slot, const std::vector<int32_t> & prompt, const SamplingParams & sampling,
                         bool want_logits, bool reuse_kv, bool alone) {
    Slot & s = at(slot);
    check_tokens(model_.vocab(), prompt, "the prompt");
    // Checked and parsed before the context is touched: a bad bias or grammar leaves everything as it was.
    Sampler chain = sampler_for(model_.vocab(), config_.ctx, sampling, prompt);
    if (alone) {
        forget_others(slot);
    }
    size_t keep = reusable_prefix(s.in_context, prompt, reuse_kv);
    // A recurrent model's state cannot be cut at an arbitrary position: then it starts afresh.
    if (alone && (keep == 0 || !context_.cut(slot, static_cast<llama_pos>(keep)))) {
        context_.clear();
        keep = 0;
    } else if (!alone && !context_.cut(slot, static_cast<llama_pos>(keep))) {
        context_.cut(slot, -1);
        keep = 0;
    }
    s.in_context.resize(keep);
    if (slot == 0) {
        drafter_.truncate(static_cast<llama_pos>(keep));
    }
    s.sampler = std::move(chain);
    s.pending.assign(prompt.begin() + static_cast<long>(keep), prompt.end());
    s.want_logits = want_logits;
    s.n_logprobs = sampling.logprobs;
    s.greedy = sampling.temp <= 0;
    s.step = 0;
    s.accepted.clear();
    s.failure.clear();
    s.active = true;
    drafter_.begin(s);
    return static_cast<int32_t>(keep);
}

bool Sequences::next(StepResult & out) {
    Slot & s = slots_.front();
    if (!s.failure.empty()) {
        throw Error("this generation stopped on an error (" + s.failure + "); begin a new one");
    }
    while (s.active) {
        BatchStep b = step();
        if (b.slots.empty()) {
            return false;
        }
        for (SlotStep & st : b.slots) {
            if (st.slot != 0) {
                continue;
            }
            if (st.context_full) {
                return false;
            }
            if (st.produced) {
                out = std::move(st.result);
                return true;
            }
        }
    }
    return false;
}

void Sequences::stop(int32_t slot) {
    Slot & s = at(slot);
    s.active = false;
    s.pending.clear();
    s.accepted.clear();
    s.sampler.reset();
}

void Sequences::clear(int32_t slot) {
    stop(slot);
    context_.cut(slot, -1);
    at(slot).in_context.clear();
}

void Sequences::forget_others(int32_t keep) {
    for (size_t s = 0; s < slots_.size(); ++s) {
        if (static_cast<int32_t>(s) == keep) {
            continue;
        }
        if (!slots_[s].in_context.empty()) {
            context_.cut(static_cast<llama_seq_id>(s), -1);
        }
        slots_[s] = Slot();
    }
}

void Sequences::forget_all() {
    for (Slot & s : slots_) {
        s = Slot();
    }
}

void Sequences::fail_all(const std::string & why) {
    // Keys and values of a half-decoded batch: nobody can vouch for them, in any slot.
    context_.clear();
    drafter_.clear();
    for (Slot & s : slots_) {
        const bool was_active = s.active;
        s = Slot();
        if (was_active) {
            s.failure = why;
        }
    }
}

}  // namespace bmoe::detail
