// The route trace: which experts every token was routed to, layer by layer, as the router chose
// them (the ids of llama.cpp's top-k node, in its order), one CSV row per token and layer:
//   step,pos,layer,experts,predicted     e.g.  3,41,1,12 7 33 2 60 5 18 9,12 7 33 4 60 5 18 9
// `predicted`: with --prefetch, the experts guessed for this layer before its router ran (for the
// whole batch: their union), empty otherwise.
// `step` is the engine's decode step (0 = the prompt), `pos` the token's position in the context.
// A --parallel step (step_slots) is numbered by its call since the engine opened, and `pos` is the
// token's index in that step's batch (the decoding slots' tokens first, in slot order, then a prompt chunk).
// In a model's last layer llama.cpp computes only the tokens whose logits are wanted: a prompt's
// last layer has one row (its last token); a speculative step's has all of them.
// The file is opened when the engine starts (a path that cannot be written fails there, before
// any generation) and flushed after every step, so a run that dies keeps what it routed.
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace bmoe::detail {

class RouteTrace {
public:
    explicit RouteTrace(const std::string & path);  // throws bmoe::Error when it cannot write there
    ~RouteTrace();
    RouteTrace(const RouteTrace &) = delete;
    RouteTrace & operator=(const RouteTrace &) = delete;

    // Before a decode step, and before each llama_decode call of it: the context position of the
    // call's first token and how many tokens it decodes.
    void begin_step(int step) { step_ = step; }
    void begin_batch(int first_pos, int n_tokens);
    // A layer's routed ids for the batch: `per_token` ids for each token in order.
    void record(int layer, const std::vector<int> & ids, int per_token);
    // With read-ahead: the guess for `layer`, written with its rows when it routes.
    void predicted(int layer, const std::vector<int> & experts);
    void end_step();

private:
    std::FILE * file_ = nullptr;
    std::string path_;
    int step_ = 0;
    int first_pos_ = 0;
    int n_tokens_ = 0;
    std::string line_;
    int guess_layer_ = -1;
    std::string guess_;
};

}  // namespace bmoe::detail
