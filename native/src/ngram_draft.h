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
// probes are not free, and a head that disagrees that long will not start agreeing).
class DraftPolicy {
public:
    explicit DraftPolicy(int draft_max = 0, int give_up_after = 0);
    int length();  // 0: do not draft this step
    void update(int drafted, int accepted);
    bool gave_up() const { return give_up_ > 0 && misses_ >= give_up_; }
    int paused() const { return pause_; }  // decodes left in the current pause (0: drafting)
    // The drafts were rejected outright twice or more in a row: the next draft is a probe of whether
    // the drafter agrees again, checked against the model's own next token rather than verified in a
    // batch (a rejected one then costs no reads for its token). One agreement ends it.
    bool probing() const { return misses_ >= 2; }

private:
    int max_;
    int length_;
    int give_up_;
    int misses_ = 0;
    int pause_ = 0;
};

}  // namespace bmoe::detail
