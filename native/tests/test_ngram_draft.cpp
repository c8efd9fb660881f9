// ngram_draft and DraftPolicy (ngram_draft.h, docs/speculation.md): the
// continuation of the latest earlier occurrence of the last 4, 3 or 2 tokens; the draft length starts
// at 2, doubles while drafts are accepted whole (up to the maximum), falls to what was accepted, and
// drafting pauses 4, 8, ... 64 decodes after drafts the model rejects outright twice in a row, and the
// drafts after such a pause are probes until one is accepted.
#include <cstdint>
#include <vector>

#include "check.h"
#include "policy/ngram_draft.h"

using bmoe::detail::DraftPolicy;
using bmoe::detail::ngram_draft;

namespace {

using Tokens = std::vector<int32_t>;

// The engine's n-gram range (DraftPolicy in policy/ngram_draft.h: kNgramMin 2, kNgramMax 4).
Tokens draft(const Tokens & history, int draft_max) { return ngram_draft(history, 2, 4, draft_max); }

// Calls length() `n` times without drafting (a pause's decodes): what it said each time.
std::vector<int> lengths(DraftPolicy & p, int n) {
    std::vector<int> out;
    for (int i = 0; i < n; ++i) {
        out.push_back(p.length());
    }
    return out;
}

}  // namespace

POLICY_TEST(ngram_draft_continues_the_latest_earlier_occurrence) {
    CHECK_EQ(draft({1, 2, 5, 6, 1, 2, 7, 8, 1, 2}, 3), Tokens({7, 8, 1}));  // the later "1 2" wins
    CHECK_EQ(draft({1, 2, 5, 6, 1, 2, 7, 8, 1, 2}, 1), Tokens({7}));        // at most draft_max
    CHECK_EQ(draft({1, 2, 3, 9, 1, 2, 3}, 8), Tokens({9, 1, 2, 3}));        // up to the end of the text
}

POLICY_TEST(ngram_draft_prefers_the_longest_match) {
    // "1 2" last followed 8 (position 5), but "7 1 2" (3 tokens) followed 4 earlier on.
    CHECK_EQ(draft({7, 1, 2, 4, 8, 1, 2, 8, 7, 1, 2}, 2), Tokens({4, 8}));
    // 4 tokens beat 3: "3 1 2 ..." is only matched as "1 2 ..." once the 4-gram "5 3 1 2" is found.
    CHECK_EQ(draft({5, 3, 1, 2, 9, 0, 3, 1, 2, 6, 5, 3, 1, 2}, 1), Tokens({9}));
}

POLICY_TEST(ngram_draft_needs_two_tokens_of_match) {
    CHECK_EQ(draft({5, 9, 5}, 4), Tokens());  // one repeated token predicts little
    CHECK_EQ(ngram_draft({5, 9, 5}, 1, 4, 4), Tokens({9, 5}));
    CHECK_EQ(draft({1, 2, 3, 4}, 4), Tokens());  // nothing repeats
    CHECK_EQ(draft({}, 4), Tokens());
    CHECK_EQ(draft({1, 2, 1, 2}, 0), Tokens());
}

POLICY_TEST(draft_length_starts_at_2_and_doubles_up_to_the_maximum) {
    DraftPolicy p(8);
    std::vector<int> seen;
    for (int i = 0; i < 5; ++i) {
        const int n = p.length();
        seen.push_back(n);
        p.update(n, n);  // accepted whole
    }
    CHECK_EQ(seen, std::vector<int>({2, 4, 8, 8, 8}));
    DraftPolicy five(5);
    CHECK_EQ(five.length(), 2);
    five.update(2, 2);
    CHECK_EQ(five.length(), 4);
    five.update(4, 4);
    CHECK_EQ(five.length(), 5);
    CHECK_EQ(DraftPolicy(1).length(), 1);
    CHECK_EQ(DraftPolicy(0).length(), 0);  // no drafting at all
}

POLICY_TEST(draft_length_falls_to_what_was_accepted) {
    DraftPolicy p(8);
    p.update(2, 2);
    p.update(4, 4);
    CHECK_EQ(p.length(), 8);
    p.update(8, 3);
    CHECK_EQ(p.length(), 3);
    p.update(3, 3);
    CHECK_EQ(p.length(), 6);
    p.update(6, 6);
    CHECK_EQ(p.length(), 8);
    p.update(8, 0);  // rejected outright: the least that still drafts
    CHECK_EQ(p.length(), 1);
}

POLICY_TEST(draft_pauses_4_8_up_to_64_after_two_outright_rejections_in_a_row) {
    DraftPolicy p(8);
    CHECK_EQ(p.length(), 2);
    p.update(2, 0);
    CHECK_EQ(p.length(), 1);  // one rejection: no pause
    p.update(1, 0);
    CHECK_EQ(lengths(p, 5), std::vector<int>({0, 0, 0, 0, 1}));
    for (int pause : {8, 16, 32, 64, 64, 64}) {  // each further outright rejection doubles it, to 64
        p.update(1, 0);
        std::vector<int> want(static_cast<size_t>(pause), 0);
        want.push_back(1);
        CHECK_EQ(lengths(p, pause + 1), want);
    }
}

POLICY_TEST(draft_an_accepted_token_ends_the_run_of_rejections) {
    DraftPolicy p(8);
    p.update(2, 0);
    p.update(1, 0);
    lengths(p, 4);
    p.update(1, 0);  // third in a row: 8
    CHECK_EQ(lengths(p, 9).back(), 1);
    p.update(1, 1);  // accepted whole: 2, and the count starts again
    CHECK_EQ(p.length(), 2);
    p.update(2, 0);
    CHECK_EQ(p.length(), 1);
    p.update(1, 0);
    CHECK_EQ(lengths(p, 5), std::vector<int>({0, 0, 0, 0, 1}));  // 4 again, not 16
    // A partial acceptance resets it too; one rejection between two accepted drafts never pauses.
    DraftPolicy q(8);
    q.update(2, 0);
    q.update(1, 1);
    q.update(2, 0);
    CHECK_EQ(q.length(), 1);
    q.update(4, 1);
    q.update(1, 0);
    CHECK_EQ(q.length(), 1);
}

POLICY_TEST(draft_probes_follow_two_outright_rejections_until_one_is_accepted) {
    DraftPolicy p(8);
    CHECK(!p.probing());
    p.update(2, 0);
    CHECK(!p.probing());  // one rejection: the next draft is verified in a batch as ever
    p.update(1, 0);
    CHECK(p.probing());  // two in a row: the draft after the pause is a probe
    lengths(p, 5);
    p.update(1, 0);
    CHECK(p.probing());
    CHECK_EQ(lengths(p, 9).back(), 1);  // the pause of 8, then the probe's one token
    p.update(1, 1);  // a probe the model agreed with: drafting as before
    CHECK(!p.probing());
    CHECK_EQ(p.length(), 2);
}

POLICY_TEST(draft_probing_first_until_the_drafter_agrees) {
    DraftPolicy p(8, 7, 4);
    CHECK(p.probing());
    CHECK_EQ(p.length(), 1);  // a probe: one token
    p.update(1, 0);
    CHECK(p.probing());
    CHECK_EQ(p.length(), 1);  // one rejection: no pause, probed again
    p.update(1, 0);
    CHECK_EQ(lengths(p, 5), std::vector<int>({0, 0, 0, 0, 1}));  // the pauses as ever
    CHECK(p.probing());
    p.update(1, 1);  // the first agreement: verified in a batch from now on, two tokens first
    CHECK(!p.probing());
    CHECK_EQ(p.length(), 2);
    p.update(2, 0);
    CHECK(!p.probing());  // one rejection after an agreement: still a batch verify
    DraftPolicy q(8, 7, 4);
    q.update(1, 1);  // the first probe agreed
    CHECK(!q.probing());
    CHECK_EQ(q.length(), 2);
}

POLICY_TEST(draft_a_drafter_that_never_agreed_is_given_up_on_after_its_first_probes) {
    DraftPolicy p(8, 7, 4);
    p.update(1, 0);
    p.update(1, 0);
    lengths(p, 5);
    p.update(1, 0);
    CHECK(!p.gave_up());
    lengths(p, 9);
    p.update(1, 0);  // the fourth probe, none agreed: stopped (decodes 0, 1, 6, 15)
    CHECK(p.gave_up());
    CHECK_EQ(lengths(p, 100), std::vector<int>(100, 0));
    DraftPolicy q(8, 7, 4);  // one agreement, then rejections: kMtpGiveUp's count, not the first probes'
    q.update(1, 1);
    for (int i = 0; i < 6; ++i) {
        q.update(1, 0);
        CHECK(!q.gave_up());
    }
    q.update(1, 0);
    CHECK(q.gave_up());
}

POLICY_TEST(draft_nothing_drafted_counts_neither_way) {
    DraftPolicy p(8);
    p.update(2, 0);
    p.update(0, 0);  // no match in the text: not a rejection
    CHECK_EQ(p.length(), 1);
    p.update(0, 0);
    p.update(1, 0);  // the second rejection in a row (the undrafted steps between do not count)
    CHECK_EQ(lengths(p, 5), std::vector<int>({0, 0, 0, 0, 1}));
}

POLICY_TEST(draft_gives_up_after_that_many_outright_rejections_in_a_row) {
    DraftPolicy p(8, 4);
    p.update(2, 0);
    p.update(1, 0);
    CHECK_EQ(lengths(p, 5), std::vector<int>({0, 0, 0, 0, 1}));
    p.update(1, 0);
    CHECK_EQ(lengths(p, 9).back(), 1);
    CHECK(!p.gave_up());
    p.update(1, 0);  // the fourth in a row: no more drafts
    CHECK(p.gave_up());
    CHECK_EQ(lengths(p, 200), std::vector<int>(200, 0));
    DraftPolicy q(8, 2);  // an accepted token in between starts the count again
    q.update(2, 0);
    q.update(1, 1);
    q.update(2, 0);
    CHECK(!q.gave_up());
    CHECK_EQ(q.length(), 1);
    CHECK(!DraftPolicy(8).gave_up());
}
