// The generations: config.parallel slots, each a sequence of the context with its own sampler, and the one
// step that advances them (step.cpp): one batch holding every decoding slot's next token (with its drafts)
// and the prompts' next chunks, each slot's drafts verified in it. A lone generation (Engine::begin/next) is
// slot 0 stepped alone: its prompt goes in whole, the rest is the same path.
#pragma once

#include <string>
#include <vector>

#include "bmoe/config.h"
#include "bmoe/engine.h"
#include "engine/context.h"
#include "engine/drafter.h"
#include "engine/model.h"
#include "engine/slot.h"
#include "engine/streaming.h"

namespace bmoe::detail {

class Sequences {
public:
    Sequences(const StreamConfig & config, const ModelSource & file, const Model & model, Context & context,
              Streaming & streaming, Drafter & drafter, const RunInfo & info);
    Sequences(const Sequences &) = delete;
    Sequences & operator=(const Sequences &) = delete;

    // A generation in `slot` (checked, sampler built, before anything is touched); with `reuse_kv` the slot's
    // common prefix with `prompt` stays (returned). `alone` (Engine::begin): every other slot is forgotten, and a
    // prompt that keeps nothing starts from a cleared context.
    int32_t begin(int32_t slot, const std::vector<int32_t> & prompt, const SamplingParams & sampling,
                  bool want_logits, bool reuse_kv, bool alone);
    // Slot 0's next token (false: ended, or its context is full). Refuses after a failed step until begun again.
    bool next(StepResult & out);
    // One step of every active slot (step.cpp). A failed decode ends every slot's generation (the context
    // cleared) and throws bmoe::Error; the file changed under us is then the message.
    BatchStep step();
    void stop(int32_t slot);
    void clear(int32_t slot);  // ... and its keys and values go
    Slot & at(int32_t slot);
    // The context was cleared or replaced under every slot.
    void forget_all();

private:
    struct Part;
    BatchStep take_step();
    void plan(BatchStep & out, std::vector<Part> & parts, int32_t per_call, const std::vector<bool> & handed_out);
    void hand_out(int32_t slot, SlotStep & out);
    llama_token verify(Slot & slot, Part & part, int32_t first_row, StepResult & out);
    void record_outputs(const Slot & slot, std::string & logits, PositionLogprobs & logprobs, int32_t row,
                        llama_token token) const;
    void emit(Slot & slot, SlotStep & out, llama_token token) const;
    void forget_others(int32_t keep);
    void fail_all(const std::string & why);

    const StreamConfig & config_;
    const ModelSource & file_;
    const Model & model_;
    Context & context_;
    Streaming & streaming_;
    Drafter & drafter_;
    const RunInfo & info_;
    std::vector<Slot> slots_;
    int batch_steps_ = 0;  // steps with more than one slot so far: the route trace's step numbers of a batch
};

}  // namespace bmoe::detail
