#include <algorithm>
#include <cctype>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bmoe/error.h"
#include "engine/engine_impl.h"
#include "model/llama_runtime.h"
#include "policy/ngram_draft.h"
#include "core/telemetry.h"

namespace bmoe {

using detail::Clock;
using detail::ms_since;

namespace {

// A batch whose every token returns logits (a speculative step verifies each draft position).
struct AllLogitsBatch {
    llama_batch batch;
    AllLogitsBatch(const llama_token * tokens, int32_t n, llama_pos first) : batch(llama_batch_init(n, 0, 1)) {
        for (int32_t i = 0; i < n; ++i) {
            batch.token[i] = tokens[i];
            batch.pos[i] = first + i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        batch.n_tokens = n;
    }
    ~AllLogitsBatch() { llama_batch_free(batch); }
    AllLogitsBatch(const AllLogitsBatch &) = delete;
    AllLogitsBatch & operator=(const AllLogitsBatch &) = delete;
};

std::string logits_of(llama_context * ctx, const llama_vocab * vocab, int32_t index) {
    const float * logits = llama_get_logits_ith(ctx, index);
    return {reinterpret_cast<const char *>(logits), static_cast<size_t>(llama_vocab_n_tokens(vocab)) * sizeof(float)};
}
}  // namespace

void Engine::Impl::run_decode(int first_pos, int n, const std::function<int()> & run) {
    if (route_trace) {
        route_trace->begin_batch(first_pos, n);
    }
    if (overlap && streaming.streamer) {
        streaming.streamer->clear_failure();
    }
    int rc = 0;
    {
        const detail::RpcWorkers::Watch deadline(rpc.get());  // a worker that stops answering: one line
        rc = run();
    }
    const std::string error = seam ? seam->take_error() : std::string();  // taken always: never stale
    if (overlap && streaming.streamer) {
        streaming.streamer->drain();  // the last layer's reads; rethrows a failed read
    }
    if (!error.empty()) {
        throw Error(error);
    }
    if (rc != 0) {
        throw Error("llama_decode failed (" + std::to_string(rc) + ")");
    }
}

void Engine::Impl::decode(std::vector<llama_token> & tokens, bool all_logits) {
    try {
        const int per_call = batch_per_call();
        for (size_t done = 0; done < tokens.size();) {
            const auto n =
                static_cast<int32_t>(std::min<size_t>(tokens.size() - done, static_cast<size_t>(per_call)));
            const auto first = static_cast<llama_pos>(in_context.size());
            run_decode(first, n, [&] {
                if (all_logits) {
                    AllLogitsBatch b(tokens.data() + done, n, first);
                    return llama_decode(ctx.get(), b.batch);
                }
                return llama_decode(ctx.get(), llama_batch_get_one(tokens.data() + done, n));
            });
            // The hidden states the head drafts from: kept only while it may draft (greedy, not given
            // up, at most kMtpResumeFeed decodes before a pause ends), else they would pile up to the
            // context's length; it restarts after such a gap.
            if (mtp && greedy && !draft_policy.gave_up() && draft_policy.paused() < detail::DraftPolicy::kMtpResumeFeed) {
                mtp->observe(tokens.data() + done, n, first, all_logits);
            }
            in_context.insert(in_context.end(), tokens.begin() + static_cast<long>(done),
                              tokens.begin() + static_cast<long>(done) + n);
            done += static_cast<size_t>(n);
        }
    } catch (...) {
        // A half-decoded batch leaves keys and values nobody can vouch for: the next generation
        // starts from an empty context.
        llama_memory_clear(llama_get_memory(ctx.get()), true);
        forget_slots();
        if (mtp) {
            mtp->clear();
        }
        in_context.clear();
        pending.clear();
        accepted.clear();
        accepted_outputs.clear();
        throw;
    }
}

void detail::check_tokens(const llama_vocab * vocab, const std::vector<int32_t> & tokens, const char * what) {
    if (tokens.empty()) {
        throw RequestError(std::string(what) + " is empty");
    }
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    for (const int32_t t : tokens) {
        if (t < 0 || t >= n_vocab) {
            throw RequestError(std::string(what) + " has token id " + std::to_string(t) +
                               ", outside the vocabulary (0 to " + std::to_string(n_vocab - 1) + ")");
        }
    }
}

std::vector<int32_t> Engine::tokenize(const std::string & text, bool add_special, bool parse_special) const {
    return detail::guarded("tokenizing the prompt", [&] {
        const llama_vocab * vocab = live().vocab;
        const auto len = static_cast<int32_t>(text.size());
        std::vector<llama_token> out(text.size() + 8);
        int32_t n = llama_tokenize(vocab, text.c_str(), len, out.data(), static_cast<int32_t>(out.size()), add_special,
                                   parse_special);
        if (n < 0) {
            out.resize(static_cast<size_t>(-n));
            n = llama_tokenize(vocab, text.c_str(), len, out.data(), static_cast<int32_t>(out.size()), add_special,
                               parse_special);
        }
        out.resize(static_cast<size_t>(std::max(n, 0)));
        return out;
    });
}

std::string Engine::detokenize(const std::vector<int32_t> & tokens) const {
    return detail::guarded("turning tokens into text", [&] {
        const llama_vocab * vocab = live().vocab;
        std::string text;
        char buf[256];
        for (int32_t t : tokens) {
            const int32_t n = llama_token_to_piece(vocab, t, buf, sizeof(buf), 0, false);
            if (n > 0) {
                text.append(buf, static_cast<size_t>(n));
            }
        }
        return text;
    });
}

int32_t Engine::begin(const std::vector<int32_t> & prompt, const SamplingParams & sampling, bool want_logits,
                      bool reuse_kv) {
    Impl & d = live();
    detail::check_tokens(d.vocab, prompt, "the prompt");
    // Checked and parsed before the context is touched: a bad bias or grammar leaves everything as it was.
    std::unique_ptr<llama_sampler, detail::SamplerDeleter> chain = d.sampler_for(sampling, prompt);
    d.forget_slots();
    llama_memory_t memory = llama_get_memory(d.ctx.get());
    size_t keep = detail::reusable_prefix(d.in_context, prompt, reuse_kv);
    // A recurrent model's state cannot be cut at an arbitrary position: then it starts afresh.
    if (keep == 0 || !llama_memory_seq_rm(memory, 0, static_cast<llama_pos>(keep), -1)) {
        llama_memory_clear(memory, true);
        keep = 0;
    }
    d.in_context.resize(keep);
    if (d.mtp) {
        d.mtp->truncate(static_cast<llama_pos>(keep));
    }
    d.sampler = std::move(chain);
    d.pending.assign(prompt.begin() + static_cast<long>(keep), prompt.end());
    d.greedy = sampling.temp <= 0;
    d.failure.clear();
    // An MTP head's or a draft model's drafts are probed first (its agreement is the drafter's; a prompt
    // lookup's is its match's) and given up on (kMtpFirstProbes, kMtpGiveUp).
    const bool mtp_drafts = d.speculation == Speculative::Mtp;
    d.draft_policy = detail::DraftPolicy(d.config.draft_max, mtp_drafts ? detail::DraftPolicy::kMtpGiveUp : 0,
                                         mtp_drafts ? detail::DraftPolicy::kMtpFirstProbes : 0);
    if (d.mtp) {  // a new generation: the head drafts again (greedy only)
        d.resume_drafting();
    }
    d.accepted.clear();
    d.accepted_outputs.clear();
    d.want_logits = want_logits;
    d.n_logprobs = sampling.logprobs;
    d.step = 0;
    return static_cast<int32_t>(keep);
}


void Engine::Impl::record_outputs(std::string & logits, PositionLogprobs & logprobs, int32_t index,
                                  llama_token token) const {
    if (want_logits) {
        logits = logits_of(ctx.get(), vocab, index);
    }
    if (n_logprobs >= 0) {
        logprobs = detail::position_logprobs(llama_get_logits_ith(ctx.get(), index), vocab, token, n_logprobs);
    }
}

std::string Engine::chat_template() const {
    const char * tmpl = llama_model_chat_template(live().model.get(), nullptr);
    return tmpl == nullptr ? std::string() : std::string(tmpl);
}

const std::vector<int32_t> & Engine::context_tokens() const { return live().in_context; }

void Engine::reset() {
    llama_memory_clear(llama_get_memory(live().ctx.get()), true);
    impl_->forget_slots();
    if (impl_->mtp) {
        impl_->mtp->clear();
    }
    impl_->in_context.clear();
    impl_->pending.clear();
    impl_->accepted.clear();
    impl_->accepted_outputs.clear();
    impl_->failure.clear();
}

uint64_t Engine::warm_cache_memory(uint64_t max_bytes) {
    Impl & d = live();
    if (!d.streaming.streamer) {
        return 0;
    }
    d.streaming.streamer->drain();  // a read-ahead batch of the last decode must land before the pool moves
    return d.streaming.streamer->warm_pool(max_bytes, d.info.expert_bytes);
}

void Engine::save_state(const std::string & path) const {
    const std::vector<llama_token> & tokens = live().in_context;
    if (!llama_state_save_file(impl_->ctx.get(), path.c_str(), tokens.data(), tokens.size())) {
        throw Error("could not write the session state to " + path);
    }
}

void Engine::load_state(const std::string & path) {
    Impl & d = live();
    std::vector<llama_token> tokens(static_cast<size_t>(d.config.ctx));
    size_t n = 0;
    if (!llama_state_load_file(d.ctx.get(), path.c_str(), tokens.data(), tokens.size(), &n)) {
        reset();
        throw Error(path + " is not a session state of this model and context size (or cannot be read)");
    }
    tokens.resize(n);
    d.forget_slots();
    if (d.mtp) {
        d.mtp->clear();  // the head restarts where the target's next decode starts
    }
    d.in_context = std::move(tokens);
    d.pending.clear();
    d.accepted.clear();
    d.accepted_outputs.clear();
}

void Engine::Impl::emit(StepResult & out, llama_token token) {
    out.token = token;
    out.end_of_generation = llama_vocab_is_eog(vocab, token);
    if (!out.end_of_generation) {
        char buf[256];
        const int32_t n = llama_token_to_piece(vocab, token, buf, sizeof(buf), 0, false);
        out.piece.assign(buf, static_cast<size_t>(std::max(n, 0)));
    } else {
        pending.clear();
        accepted.clear();
    }
    ++step;
}

llama_token Engine::Impl::verify(std::vector<llama_token> & batch, size_t n_draft, StepResult & out) {
    // The model's choice after each of the last 1 + n_draft positions: keep drafts while they agree.
    const auto first = static_cast<int32_t>(batch.size() - n_draft - 1);
    std::vector<llama_token> chosen;
    for (size_t j = 0; j <= n_draft; ++j) {
        const llama_token t = llama_sampler_sample(sampler.get(), ctx.get(), first + static_cast<int32_t>(j));
        chosen.push_back(t);
        if (j == 0) {
            record_outputs(out.logits, out.logprobs, first, t);
        } else {
            Verified & v = accepted_outputs.emplace_back();
            record_outputs(v.logits, v.logprobs, first + static_cast<int32_t>(j), t);
        }
        if (j == n_draft || t != batch[static_cast<size_t>(first) + j + 1] || llama_vocab_is_eog(vocab, t)) {
            break;
        }
    }
    const size_t kept = chosen.size() - 1;  // drafts the model agreed with
    const auto cut = static_cast<llama_pos>(in_context.size() - (n_draft - kept));
    if (!llama_memory_seq_rm(llama_get_memory(ctx.get()), 0, cut, -1)) {
        throw Error("speculative decoding cannot roll back this model's context (a recurrent model?): "
                    "run it without --speculative");
    }
    in_context.resize(static_cast<size_t>(cut));
    if (mtp) {
        mtp->truncate(cut);  // the head's states of the rejected drafts go too
    }
    out.metrics.drafted = static_cast<int>(n_draft);
    out.metrics.accepted = static_cast<int>(kept);
    learn_from_drafts(out.metrics.drafted, out.metrics.accepted);
    accepted.assign(chosen.begin() + 1, chosen.end());
    pending.assign(1, chosen.back());
    return chosen.front();
}

bool Engine::next(StepResult & out) {
    Impl & d = live();
    if (!d.failure.empty()) {
        throw Error("this generation stopped on an error (" + d.failure + "); begin a new one");
    }
    try {
        return detail::guarded("decoding", [&] { return d.step_once(out); });
    } catch (const Error & e) {
        // A read error may be the file changing under us: then that is the message.
        const std::string changed = d.gguf->changed();
        d.failure = changed.empty() ? e.what() : changed;
        d.pending.clear();
        d.accepted.clear();
        d.accepted_outputs.clear();
        throw Error(d.failure);
    }
}

void Engine::Impl::make_room_for_prompt(int n_tokens, int n_sequences) {
    detail::Streamer & streamer = *streaming.streamer;
    streamer.count_uses_per_sequence(n_sequences);
    const uint64_t budget = streamer.cache().budget();
    // A prompt decoded in ubatches of prompt_ubatch writes that share of the compute buffers (made for ubatch).
    const uint64_t room = memory->before_prompt(budget, streamer.pool_held_bytes(), std::min(n_tokens, prompt_ubatch),
                                                config.ubatch);
    if (room != budget) {
        streamer.set_budget(room);
    }
    seam->begin_decode();
}

uint64_t Engine::Impl::give_prompt_memory_back() {
    detail::Streamer & streamer = *streaming.streamer;
    std::vector<detail::Region> scratch;
    for (const detail::RuntimeBuffer & b : seam->last_scratch()) {
        scratch.push_back({b.data, b.size});
    }
    streamer.count_uses_per_sequence(0);
    const uint64_t budget = streamer.cache().budget();
    streamer.settle();  // the layers the prompt left over their share, and the pool's spare pages
    const uint64_t after = memory->after_prompt(budget, streamer.pool_held_bytes(), scratch);
    if (after != budget) {
        streamer.set_budget(after);
    }
    return memory->released_bytes();
}

bool Engine::Impl::step_once(StepResult & out) {
    Impl & d = *this;
    if (!d.accepted.empty()) {  // a token the last speculative step already verified: no decode
        out = StepResult{};
        out.metrics.step = d.step;
        out.metrics.rss_bytes = detail::rss_bytes();
        if (!d.accepted_outputs.empty()) {
            out.logits = std::move(d.accepted_outputs.front().logits);
            out.logprobs = std::move(d.accepted_outputs.front().logprobs);
            d.accepted_outputs.pop_front();
        }
        const llama_token token = d.accepted.front();
        d.accepted.pop_front();
        d.emit(out, token);
        return true;
    }
    if (d.pending.empty()) {
        return false;
    }
    // The model must still be the file we opened: a truncated mapping would be a SIGBUS, a rewrite
    // wrong tokens. (A change during this decode is caught by the next check or by a read.)
    d.gguf->check_unchanged();
    const llama_pos used = llama_memory_seq_pos_max(llama_get_memory(d.ctx.get()), 0) + 1;
    if (used + static_cast<llama_pos>(d.pending.size()) > static_cast<llama_pos>(d.config.ctx)) {
        return false;
    }
    out = StepResult{};
    out.metrics.step = d.step;
    const uint64_t faults0 = detail::major_faults();
    const uint64_t net0 = d.rpc ? d.rpc->network_bytes() : 0;
    const auto t0 = Clock::now();
    if (d.streaming.streamer) {
        d.streaming.streamer->take_counters();  // start this step's counters from zero
    }
    if (d.route_trace) {
        d.route_trace->begin_step(d.step);
    }
    if (d.prefetch) {
        out.metrics.read_ahead = d.prefetch->reads_ahead();
        d.seam->set_reading_ahead(out.metrics.read_ahead);
    }
    // Inside the step's time and counters: an MTP head's drafts are decodes, with reads of their own.
    const std::vector<llama_token> draft = d.draft_for(used);
    // A probe (DraftPolicy::probing) is checked against the token this step decodes alone: a random
    // head's two-token probe verifies read 4% more bytes per token over 192 tokens than plain decoding
    // (bench-data/2026-12-03/mtp-assistant); the tokens are plain decoding's either way.
    const bool probe = !draft.empty() && d.draft_policy.probing();
    std::vector<llama_token> batch(d.pending);
    if (!probe) {
        batch.insert(batch.end(), draft.begin(), draft.end());
    }
    out.metrics.n_tokens = static_cast<int>(batch.size());
    // A prompt's batch writes compute buffers sized for it that no decode after it needs: room is
    // made for them first, and they go back to the cache once the prompt is in (docs/memory.md).
    const bool prompt = d.pending.size() > 1 && d.streaming.streamer && d.memory && !d.rpc;
    if (prompt) {
        d.make_room_for_prompt(static_cast<int>(batch.size()));
    }
    // A long prompt computes on every core (create_context says why); a decode's few tokens wait on their
    // reads, and there a spinning compute thread per core starves the lanes.
    const bool all_cores = d.pending.size() >= static_cast<size_t>(Impl::kPromptAllCoresTokens);
    {
        const detail::BatchThreads threads(d.ctx.get(), d.decode_threads, all_cores ? d.prompt_threads : d.decode_threads);
        d.decode(batch, !draft.empty() && !probe);
    }
    if (prompt) {
        out.metrics.released_bytes = d.give_prompt_memory_back();
    }
    if (d.route_trace) {
        d.route_trace->end_step();
    }
    llama_token token = 0;
    if (draft.empty() || probe) {
        token = llama_sampler_sample(d.sampler.get(), d.ctx.get(), -1);
        d.record_outputs(out.logits, out.logprobs, -1, token);
        d.pending.assign(1, token);
        if (probe) {
            d.check_probe(draft.front(), token, out);
        }
    } else {
        token = d.verify(batch, draft.size(), out);
    }
    out.metrics.wall_ms = ms_since(t0);
    if (d.prefetch && batch.size() == 1) {
        d.prefetch->record(out.metrics.wall_ms);
    }
    out.metrics.net_bytes = d.rpc ? d.rpc->network_bytes() - net0 : 0;
    if (d.streaming.streamer) {
        const detail::StreamCounters c = d.streaming.streamer->take_counters();
        out.metrics.io_ms = c.io_ms;
        out.metrics.stall_ms = c.stall_ms;
        out.metrics.drain_ms = c.drain_ms;
        out.metrics.bytes_read = c.storage_bytes;
        out.metrics.slice_bytes = c.slice_bytes;
        out.metrics.copy_bytes = c.copy_bytes;
        out.metrics.cache_lookups = c.lookups;
        out.metrics.cache_hits = c.hits;
        out.metrics.evictions = c.evictions;
        out.metrics.rereads = c.rereads;
        out.metrics.dropped = d.seam->take_dropped();
        out.metrics.predicted = c.predicted;
        out.metrics.predicted_correct = c.predicted_correct;
        out.metrics.ahead_bytes = c.ahead_bytes;
        out.metrics.ahead_wasted_bytes = c.ahead_wasted_bytes;
        out.metrics.routed_bytes = c.routed_bytes;
        detail::Streamer & streamer = *d.streaming.streamer;
        out.metrics.resident_expert_bytes = streamer.resident_expert_bytes();
        const uint64_t budget = streamer.cache().budget();
        // A prompt's step was rebased just now, and its major faults are the dense weights' first reads.
        const uint64_t adapted =
            prompt ? budget : d.memory->adapt(budget, streamer.pool_held_bytes(), detail::major_faults() - faults0);
        if (adapted != budget) {
            streamer.set_budget(adapted);
        } else if (!prompt) {
            streamer.trim_spare();
        }
        out.metrics.cache_budget_bytes = adapted;
        out.metrics.pool_bytes = streamer.pool_held_bytes();
    }
    out.metrics.compute_ms = out.metrics.wall_ms - out.metrics.stall_ms;
    out.metrics.major_faults = detail::major_faults() - faults0;
    out.metrics.rss_bytes = detail::rss_bytes();
    d.emit(out, token);
    return true;
}

}  // namespace bmoe
