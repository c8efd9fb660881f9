// Prompt-lookup drafting for speculative decoding: the continuation that followed the latest
// earlier occurrence of the text's last n tokens (n from `max_ngram` down to 1). Repetitive text
// (code, lists, summaries of the prompt) drafts well; free prose drafts rarely, and then costs
// nothing. Policy only: the engine verifies every draft against the model.
#pragma once

#include <cstdint>
#include <vector>

namespace bmoe::detail {

// Matches of at least `min_ngram` tokens only: a single repeated token predicts little in real text.
std::vector<int32_t> ngram_draft(const std::vector<int32_t> & history, int min_ngram, int max_ngram, int draft_max);

// How many tokens to draft next. With expert streaming every drafted token's experts are read too,
// so a rejected draft costs reads, not only compute: the length starts small, doubles while drafts
// are accepted whole, falls to what was accepted, and drafting pauses (4, 8, ... 64 decodes) after
// drafts the model rejects outright twice in a row. With `give_up_after` > 0, that many outright
// rejections in a row stop drafting for good (a draft that costs model decodes, the MTP head's: its
// probes are not free, and a head that disagrees that long will not start agreeing). With
// `first_probes` > 0, a generation's drafts are probes (one token) until the drafter's first
// agreement, and that many rejected probes before any agreement are a give-up too: a drafter whose
// every draft is rejected (an MTP head or a draft model that does not fit the model) then never costs
// a batch verify and stops soon, while one whose first token is right 70% of the time loses one
// step's draft (and, with 4 first probes, fails them all once in 120 generations).
class DraftPolicy {
public:
    static constexpr int kNgramMin = 2;      // prompt lookup: the shortest and longest n-gram matched
    static constexpr int kNgramMax = 4;
    // The MTP head's drafts cost head decodes (and a catch-up feed after each pause): after this many
    // outright rejections in a row (4 + 8 + 16 + 32 + 64 decodes of pauses between them) it stops.
    static constexpr int kMtpGiveUp = 7;
    // ... and after this many rejected probes before its first agreement in a generation (probes at
    // decodes 1, 2, 7 and 16: this policy's pauses), a drafter that does not fit the model at all.
    static constexpr int kMtpFirstProbes = 4;
    // While paused, the head sees only the last this many decodes before it drafts again (its context
    // restarts there): a catch-up over the whole pause would read most of its layer's experts.
    static constexpr int kMtpResumeFeed = 4;
    // The drafter's pages sleep through a pause this long or longer (pauses: 4, 8, 16, 32, 64).
    static constexpr int kSleepDrafterPause = 16;

    explicit DraftPolicy(int draft_max = 0, int give_up_after = 0, int first_probes = 0);
    int length();  // 0: do not draft this step
    void update(int drafted, int accepted);
    bool gave_up() const {
        return (give_up_ > 0 && misses_ >= give_up_) || (!agreed_ && first_probes_ > 0 && misses_ >= first_probes_);
    }
    int paused() const { return pause_; }  // decodes left in the current pause (0: drafting)
    // The drafts were rejected outright twice or more in a row (or, probing first, none agreed yet):
    // the next draft is a probe of whether the drafter agrees (again), one token checked against the
    // model's own next token rather than verified in a batch (a rejected one then costs no reads for
    // its token). One agreement ends it.
    bool probing() const { return misses_ >= 2 || !agreed_; }

private:
    int max_;
    int length_;
    int give_up_;
    int first_probes_;
    int misses_ = 0;
    int pause_ = 0;
    bool agreed_;  // the drafter agreed with the model at least once (or was not to be probed first)
};

}  // namespace bmoe::detail
