#include "ngram_draft.h"

#include <algorithm>

namespace bmoe::detail {

std::vector<int32_t> ngram_draft(const std::vector<int32_t> & history, int max_ngram, int draft_max) {
    const auto n_hist = static_cast<int64_t>(history.size());
    for (int n = std::min<int64_t>(max_ngram, n_hist - 1); n >= 1; --n) {
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

}  // namespace bmoe::detail
