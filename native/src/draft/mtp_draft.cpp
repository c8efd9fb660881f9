#include "draft/mtp_draft.h"

#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>

#include "bmoe/error.h"
#include "bmoe/recipes.h"
#include "model/gguf_map.h"
#include "model/llama_runtime.h"
#include "core/telemetry.h"
// The staging API (the pin's src/llama-ext.h): the target's hidden states for the head, as the pin's
// common/speculative.cpp reads them. Only this file includes it.
#include "llama-ext.h"

namespace bmoe::detail {
namespace {

llama_token argmax(const float * logits, int32_t n_vocab) {
    return static_cast<llama_token>(std::max_element(logits, logits + n_vocab) - logits);
}

// "gemma4-assistant for gemma4": the recipe rows that name a draft model.
std::string assistant_list() {
    std::string out;
    for (const Recipe & r : recipes()) {
        if (!r.draft_model.empty()) {
            out += (out.empty() ? "" : ", ") + r.draft_model + " for " + r.architecture;
        }
    }
    return out;
}

std::string meta_text(const llama_model * model, const char * key) {
    char buf[256];
    return llama_model_meta_val_str(model, key, buf, sizeof(buf)) < 0 ? std::string() : std::string(buf);
}

}  // namespace

int MtpDraft::heads(const llama_model * model) { return std::max(0, llama_model_n_layer_nextn(model)); }

MtpDraft::MtpDraft(llama_model * model, llama_context * target, llama_context_params params)
    : MtpDraft(nullptr, model, target, params, "") {}

MtpDraft::MtpDraft(llama_model_ptr own, llama_model * model, llama_context * target, llama_context_params params,
                   std::string path)
    : own_model_(std::move(own)), target_(target), vocab_(llama_model_get_vocab(model)),
      n_embd_(static_cast<size_t>(llama_model_n_embd_out(model))), heads_(heads(model)),
      // Several next-n blocks chain (the pin's driver: n_mtp_layers > 1 without a shared KV), one per
      // draft step; an architecture whose graph_mtp ignores the offset runs its first block each time.
      chained_(heads_ > 1 && own_model_ == nullptr), shared_(own_model_ != nullptr), path_(std::move(path)),
      hidden_(n_embd_, 0.0f) {
    params.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    params.n_ctx = llama_n_ctx(target);
    params.n_rs_seq = 0;
    params.ctx_other = target;  // what the models whose head shares the target's memory need
    // Its outputs are a draft's one row (or one per sequence: llama.cpp reserves those at creation),
    // never a feed's: sized for those, its compute buffers hold no n_vocab-wide logits for a batch.
    params.n_outputs_max = std::max<uint32_t>(1, params.n_seq_max);
    if (shared_) {  // the seam matches the target's `blk.N.` names: a separate model's are not those
        params.cb_eval = nullptr;
        params.cb_eval_user_data = nullptr;
        // Nothing is fed: it decodes one token at a time, so its compute and output buffers are one
        // token's, or one per sequence (llama.cpp reserves an output for each at creation).
        params.n_batch = std::max<uint32_t>(1, params.n_seq_max);
        params.n_ubatch = params.n_batch;
    }
    model_ = model;
    params_ = params;
    make_context();
    if (shared_ && llama_get_ctx_other(ctx_.get()) != target_) {
        throw Error("the draft model's context does not share the target's KV cache (llama.cpp set no ctx_other)");
    }
    ask_target_states();
    if (shared_) {  // its weights are the mapping's bytes
        for (const FileMapping & m : file_mappings(path_)) {
            pages_.push_back({path_, m.start, m.bytes, m.file_offset});
        }
    }
}

std::unique_ptr<MtpDraft> MtpDraft::assistant(const std::string & path, llama_context * target,
                                              llama_context_params params) {
    const llama_model * target_model = llama_get_model(target);
    const std::string target_arch = meta_text(target_model, "general.architecture");
    const std::string wanted = recipe_for(target_arch).draft_model;
    if (wanted.empty()) {
        throw Error("--draft-model: a '" + target_arch + "' model takes no separate draft model here (one that "
                    "shares its KV cache: " + assistant_list() + ")");
    }
    const std::string arch = GgufMap(path).architecture();  // the header first: never load a wrong model
    if (arch != wanted) {
        throw Error(path + ": a '" + arch + "' model is not a draft model for this '" + target_arch + "' model (a '" +
                    wanted + "' file is)");
    }
    llama_model_params mp = llama_model_default_params();
    // Mapped: its pages can be dropped while it does not draft (sleep) and come back from the file.
    // Resident once it has decoded (the warm-up does, while streaming), so the budget counts it.
    mp.load_mode = LLAMA_LOAD_MODE_MMAP;
    mp.use_extra_bufts = false;  // its weights are the mapping's bytes
    mp.n_gpu_layers = 0;
    clear_llama_error();
    llama_model_ptr model(llama_model_load_from_file(path.c_str(), mp));
    if (!model) {
        const std::string why = last_llama_error();
        throw Error(path + ": llama.cpp could not load the draft model" + (why.empty() ? "" : " (" + why + ")"));
    }
    const int32_t width = llama_model_n_embd_out(model.get());
    if (width != llama_model_n_embd_out(target_model)) {
        throw Error(path + ": the draft model takes hidden states " + std::to_string(width) + " wide, the model's are " +
                    std::to_string(llama_model_n_embd_out(target_model)));
    }
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model.get()));
    if (n_vocab != llama_vocab_n_tokens(llama_model_get_vocab(target_model))) {
        throw Error(path + ": the draft model's vocabulary (" + std::to_string(n_vocab) +
                    " tokens) is not the model's");
    }
    llama_model * raw = model.get();
    return std::unique_ptr<MtpDraft>(new MtpDraft(std::move(model), raw, target, params, path));
}

void MtpDraft::make_context() {
    clear_llama_error();
    ctx_.reset(llama_init_from_model(model_, params_));
    if (!ctx_) {
        const std::string why = last_llama_error();
        throw Error("llama.cpp could not create the MTP draft context" + (why.empty() ? "" : " (" + why + ")"));
    }
    llama_set_embeddings_nextn(ctx_.get(), true, true);  // masked: only its output row
    if (abort_ != nullptr) {
        llama_set_abort_callback(ctx_.get(), abort_, abort_data_);
    }
}

void MtpDraft::set_abort_callback(ggml_abort_callback abort, void * data) {
    abort_ = abort;
    abort_data_ = data;
    if (ctx_) {
        llama_set_abort_callback(ctx_.get(), abort, data);
    }
}

void MtpDraft::set_own_pages(std::vector<DrafterPages> pages) {
    const auto displacement = [](const DrafterPages & p) {
        return reinterpret_cast<uintptr_t>(p.data) - static_cast<uintptr_t>(p.file_offset);
    };
    std::sort(pages.begin(), pages.end(), [](const DrafterPages & a, const DrafterPages & b) {
        return std::tie(a.file, a.file_offset) < std::tie(b.file, b.file_offset);
    });
    pages_.clear();
    for (DrafterPages & p : pages) {
        if (!pages_.empty() && pages_.back().file == p.file && displacement(pages_.back()) == displacement(p)) {
            DrafterPages & span = pages_.back();
            span.bytes = std::max(span.bytes, p.file_offset + p.bytes - span.file_offset);
        } else {
            pages_.push_back(std::move(p));
        }
    }
}

void MtpDraft::sleep() {
    if (asleep_) {
        return;
    }
    asleep_ = true;
    if (!shared_) {  // its own KV would restart after the pause anyway (observe), so the context goes too
        base_ = 0;
        unfed_.clear();
        hidden_.assign(n_embd_, 0.0f);
        ctx_.reset();
#ifdef __GLIBC__
        // glibc keeps the freed buffers in its heap (1.3 MiB of the 6 on the 24-layer fixture): handed
        // back, the budget takes them with the rest (MemoryBudget::after_release reads what was given back).
        malloc_trim(0);
#endif
    }
    for (const DrafterPages & p : pages_) {
        // Whole pages only: a page shared with a neighbouring tensor stays (a trunk tensor would fault
        // it back at once).
        const DroppedPages dropped = drop_mapped_pages(p.data, p.bytes);
        if (dropped.bytes == 0) {
            continue;
        }
        const int fd = open(p.file.c_str(), O_RDONLY | O_CLOEXEC);  // ... and out of the page cache (its charge)
        if (fd >= 0) {
            posix_fadvise(fd, static_cast<off_t>(p.file_offset + dropped.skip), static_cast<off_t>(dropped.bytes),
                          POSIX_FADV_DONTNEED);
            close(fd);
        }
    }
}

void MtpDraft::wake() {
    if (!asleep_) {
        return;
    }
    asleep_ = false;
    if (!ctx_) {
        // Memory the board no longer has is no reason to fail the step: without a context draft() drafts
        // nothing, and the next wake tries again.
        try {
            make_context();
        } catch (const Error &) {
            ctx_.reset();
        }
    }
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    for (const DrafterPages & p : pages_) {  // read ahead, not one fault at a time in the draft
        const auto start = reinterpret_cast<uintptr_t>(p.data) / page * page;
        madvise(reinterpret_cast<void *>(start), p.bytes + (reinterpret_cast<uintptr_t>(p.data) - start), MADV_WILLNEED);
    }
}

MtpDraft::~MtpDraft() = default;

void MtpDraft::set_enabled(bool on) {
    enabled_ = on;
    ask_target_states();
}

void MtpDraft::keep_every_state() {
    if (!shared_ && !every_state_) {
        every_state_ = true;
        ask_target_states();
    }
}

// Masked: states only where logits are asked for; unmasked: a state for every position decoded (the
// target's last layer then computes them all), while logits stay where they were asked for.
void MtpDraft::ask_target_states() { llama_set_embeddings_nextn(target_, enabled_, !every_state_); }

void MtpDraft::select_head(int head, llama_pos from) {
    // Each block's keys and values are its own layer's, but the cells (positions) are shared by all:
    // the positions a block is about to decode are cleared, and it rebuilds its layer there (the pin's
    // common/speculative.cpp does the same; the cells come back in the same place, so the other
    // blocks' layers there stay theirs).
    llama_memory_seq_rm(llama_get_memory(ctx_.get()), 0, from, -1);
    llama_set_nextn_layer_offset(ctx_.get(), head);
}

void MtpDraft::decode_rows(const llama_token * tokens, const float * rows, int n, llama_pos first, bool output,
                           const Decode & decode) {
    llama_batch_ext_ptr batch(llama_batch_ext_init(ctx_.get()));
    for (int i = 0; i < n; ++i) {
        const int32_t idx = llama_batch_ext_add_token(batch.get(), 0, tokens[i]);
        const llama_pos pos = first + i;
        if (idx < 0 || !llama_batch_ext_set_pos(batch.get(), idx, &pos) ||
            !llama_batch_ext_set_embd_token(batch.get(), idx, {rows + static_cast<size_t>(i) * n_embd_, 1, n_embd_}) ||
            !llama_batch_ext_set_output_logits(batch.get(), idx, output && i == n - 1)) {
            throw Error("could not build the MTP head's batch (" + std::to_string(idx) + ")");
        }
    }
    decode(first, n, [&] { return llama_process(ctx_.get(), LLAMA_PROCESS_TYPE_DECODE, batch.get()); });
}

void MtpDraft::warm_up(llama_token token, const Decode & decode) {
    const std::vector<float> zeros(n_embd_, 0.0f);
    // A shared KV holds the target's warm-up token at 0: the draft model's goes after it, as a draft does.
    const llama_pos pos = shared_ ? 1 : 0;
    for (int head = 0; head < std::max(1, layers()); ++head) {  // every block's experts captured
        if (chained_) {
            select_head(head, 0);
        }
        decode_rows(&token, zeros.data(), 1, pos, true, decode);
    }
    clear();
}

void MtpDraft::observe(const llama_token * tokens, int n, llama_pos first, bool every_row_out, bool last_row_out) {
    if (!every_state_ && !every_row_out) {  // the batch's last state is the one the next draft starts from
        if (last_row_out) {  // masked states exist only where logits were asked for
            restart_after(first + n, target_state(n - 1));
        }
        return;
    }
    const auto next = base_ + static_cast<llama_pos>(unfed_.size());
    if (first < next) {
        truncate(first);
    } else if (first > next) {  // positions the head never saw: start its context afresh there
        clear();
        base_ = first;
    }
    if (shared_) {  // nothing is fed: only the latest decode's states can still be wanted (a verify's cut)
        feed(0, {});
    }
    for (int i = 0; i < n; ++i) {
        const float * h = target_state(i);
        unfed_.push_back(tokens[i]);
        hidden_.insert(hidden_.end(), h, h + n_embd_);
    }
}

const float * MtpDraft::target_state(int i) const {
    const float * h = llama_get_embeddings_nextn_ith(target_, i);
    if (h == nullptr) {
        throw Error("the target context gave no hidden state for the MTP head (llama.cpp's next-n output)");
    }
    return h;
}

void MtpDraft::restart_after(llama_pos next, const float * state) {
    if (!shared_ && ctx_) {  // (without clear's zeroing: a probe's own position is gone after its draft)
        llama_memory_seq_rm(llama_get_memory(ctx_.get()), 0, -1, -1);
    }
    base_ = next;
    unfed_.clear();
    hidden_.assign(state, state + n_embd_);
}

void MtpDraft::truncate(llama_pos n) {
    if (n < base_) {  // the head's own context goes back too; the state before n is not kept: zeros
        if (!shared_ && ctx_) {  // a shared KV is the target's: its cut is the target's own
            llama_memory_seq_rm(llama_get_memory(ctx_.get()), 0, n, -1);
        }
        base_ = n;
        unfed_.clear();
        hidden_.assign(n_embd_, 0.0f);
        return;
    }
    const auto keep = static_cast<size_t>(n - base_);
    if (keep < unfed_.size()) {
        unfed_.resize(keep);
        hidden_.resize((keep + 1) * n_embd_);
    }
}

void MtpDraft::clear() {
    if (!shared_ && ctx_) {  // (llama.cpp's clear of a shared cache would reset the target's cells)
        llama_memory_clear(llama_get_memory(ctx_.get()), true);
    }
    if (chained_ && ctx_) {
        llama_set_nextn_layer_offset(ctx_.get(), 0);
    }
    base_ = 0;
    unfed_.clear();
    hidden_.assign(n_embd_, 0.0f);
}

// The positions the target decoded since the last draft, each token with the hidden state before it
// (chained heads: to every block in turn; a shared KV needs none: the target's keys and values are
// the draft model's).
void MtpDraft::feed(int batch, const Decode & decode) {
    for (int head = 0; head < layers() && !unfed_.empty(); ++head) {
        if (chained_) {
            select_head(head, base_);
        }
        for (size_t done = 0; done < unfed_.size();) {
            const size_t n = std::min(unfed_.size() - done, static_cast<size_t>(std::max(1, batch)));
            decode_rows(unfed_.data() + done, hidden_.data() + done * n_embd_, static_cast<int>(n),
                        base_ + static_cast<llama_pos>(done), false, decode);
            done += n;
        }
    }
    base_ += static_cast<llama_pos>(unfed_.size());
    hidden_.erase(hidden_.begin(), hidden_.end() - static_cast<long>(n_embd_));
    unfed_.clear();
}

std::vector<llama_token> MtpDraft::draft(llama_token last, llama_pos pos, int max, int batch, const Decode & decode) {
    truncate(pos);
    if (!ctx_ || base_ + static_cast<llama_pos>(unfed_.size()) != pos) {
        return {};  // the head has not seen what lies before pos (observe restarts it)
    }
    std::vector<llama_token> out;
    const int32_t n_vocab = llama_vocab_n_tokens(vocab_);
    // One head: the latest token and state, one position further each step. Chained: block i decodes
    // the whole prefix (last, d1 .. di) with the states before each (the target's, then blocks 0 ..
    // i-1's), its own layer having nothing at the draft positions yet.
    std::vector<llama_token> tokens{last};
    std::vector<float> rows(hidden_.end() - static_cast<long>(n_embd_), hidden_.end());
    const int steps = chained_ ? std::min(max, heads_) : max;
    try {
        feed(batch, decode);
        for (int i = 0; i < steps; ++i) {
            if (chained_) {
                select_head(i, pos);
                decode_rows(tokens.data(), rows.data(), i + 1, pos, true, decode);
            } else {  // a shared KV: every draft at the target's next position (nothing of it is stored)
                decode_rows(&tokens.back(), rows.data(), 1, shared_ ? pos : pos + i, true, decode);
            }
            const llama_token token = argmax(llama_get_logits_ith(ctx_.get(), -1), n_vocab);
            out.push_back(token);
            const float * next = llama_get_embeddings_nextn_ith(ctx_.get(), -1);
            if (next == nullptr || llama_vocab_is_eog(vocab_, token)) {
                break;
            }
            if (chained_) {
                tokens.push_back(token);
                rows.insert(rows.end(), next, next + n_embd_);
            } else {
                tokens.back() = token;
                std::memcpy(rows.data(), next, n_embd_ * sizeof(float));
            }
        }
    } catch (...) {  // a failed decode (a read error) leaves the head's context unknown: it starts afresh
        clear();
        throw;
    }
    // The draft positions go: the head is fed what the target verifies, with the target's states.
    if (!shared_) {
        llama_memory_seq_rm(llama_get_memory(ctx_.get()), 0, pos, -1);
    }
    if (chained_) {
        llama_set_nextn_layer_offset(ctx_.get(), 0);
    }
    return out;
}

}  // namespace bmoe::detail
