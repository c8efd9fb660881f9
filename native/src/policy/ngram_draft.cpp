#include "policy/ngram_draft.h"

#include <algorithm>

namespace bmoe::detail {

std::vector<int32_t> ngram_draft(const std::vector<int32_t> & history, int min_ngram, int max_ngram, int draft_max) {
    const auto n_hist = static_cast<int64_t>(history.size());
    for (int n = static_cast<int>(std::min<int64_t>(max_ngram, n_hist - 1)); n >= std::max(1, min_ngram); --n) {
        const auto tail = history.end() - n;
        // The latest earlier match: its continuation is the likeliest to repeat now.
        for (int64_t start = n_hist - n - 1; start >= 0; --start) {
            if (!std::equal(tail, history.end(), history.begin() + start)) {
                continue;
            }
            const int64_t from = start + n;
            const int64_t to = std::min<int64_t>(from + draft_max, n_hist);
            if (to > from) {
                return {history.begin() + from, history.begin() + to};
            }
        }
    }
    return {};
}

DraftPolicy::DraftPolicy(int draft_max, int give_up_after, int first_probes)
    : max_(draft_max), length_(std::min(first_probes > 0 ? 1 : 2, draft_max)), give_up_(give_up_after),
      first_probes_(first_probes), agreed_(first_probes <= 0) {}

int DraftPolicy::length() {
    if (gave_up()) {
        return 0;
    }
    if (pause_ > 0) {
        --pause_;
        return 0;
    }
    return length_;
}

void DraftPolicy::update(int drafted, int accepted) {
    if (drafted <= 0) {
        return;
    }
    if (accepted > 0) {
        agreed_ = true;
    }
    if (accepted >= drafted) {
        misses_ = 0;
        length_ = std::min(max_, length_ * 2);
    } else if (accepted == 0) {
        length_ = 1;
        if (++misses_ >= 2) {
            pause_ = 4 << std::min(misses_ - 2, 4);
        }
    } else {
        misses_ = 0;
        length_ = std::max(1, accepted);
    }
}

}  // namespace bmoe::detail
