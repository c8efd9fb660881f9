// Prompt-lookup drafting for speculative decoding: the continuation that followed the latest
// earlier occurrence of the text's last n tokens (n from `max_ngram` down to 1). Repetitive text
// (code, lists, summaries of the prompt) drafts well; free prose drafts rarely, and then costs
// nothing. Policy only: the engine verifies every draft against the model.
#pragma once

#include <cstdint>
#include <vector>

namespace bmoe::detail {

std::vector<int32_t> ngram_draft(const std::vector<int32_t> & history, int max_ngram, int draft_max);

}  // namespace bmoe::detail
