// place_layers and describe (rpc_placement.h, docs/rpc.md): whole layers, the main process's first,
// then each worker's run in order, the output layer with the last worker. Shares by --rpc-split
// weights (largest remainders, ties to the earlier participant), or by free memory, where a worker
// takes at most what fits beside kWorkerReserveBytes and the main process streams the rest.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "policy/rpc_placement.h"

using bmoe::detail::describe;
using bmoe::detail::kWorkerReserveBytes;
using bmoe::detail::LayerPlacement;
using bmoe::detail::place_layers;
using bmoe::detail::PlacementInput;

namespace {

constexpr uint64_t MiB = 1ull << 20;

// `n` layers of 100 MiB and a 10 MiB output layer; workers named a:1, b:2, ... with plenty free.
PlacementInput layers(int n, std::vector<double> weights, size_t n_workers) {
    PlacementInput in;
    in.layer_bytes.assign(static_cast<size_t>(n), 100 * MiB);
    in.output_bytes = 10 * MiB;
    in.weights = std::move(weights);
    in.main_free = 64 * 1024 * MiB;
    for (size_t w = 0; w < n_workers; ++w) {
        in.worker_free.push_back(64 * 1024 * MiB);
        in.workers.push_back(std::string(1, static_cast<char>('a' + w)) + ":" + std::to_string(w + 1));
    }
    return in;
}

std::vector<int> counts(const LayerPlacement & p) {
    std::vector<int> out{p.main_layers};
    out.insert(out.end(), p.worker_layers.begin(), p.worker_layers.end());
    return out;
}

}  // namespace

POLICY_TEST(rpc_split_weights_give_largest_remainder_shares) {
    CHECK_EQ(counts(place_layers(layers(8, {1, 3}, 1))), std::vector<int>({2, 6}));
    // 10 / 3 each: the one layer left over goes to the earliest (this process).
    CHECK_EQ(counts(place_layers(layers(10, {1, 1, 1}, 2))), std::vector<int>({4, 3, 3}));
    // 3.5, 1.75, 1.75: the two larger remainders get one each.
    CHECK_EQ(counts(place_layers(layers(7, {2, 1, 1}, 2))), std::vector<int>({3, 2, 2}));
    const LayerPlacement p = place_layers(layers(10, {1, 1, 1}, 2));
    CHECK_EQ(p.worker_bytes, std::vector<uint64_t>({300 * MiB, 310 * MiB}));  // the last holds the output
}

POLICY_TEST(rpc_streaming_keeps_a_layer_in_the_main_process) {
    PlacementInput in = layers(8, {0, 1, 1}, 2);
    CHECK_EQ(counts(place_layers(in)), std::vector<int>({1, 3, 4}));  // taken from the largest share
    in.main_keeps_one = false;
    CHECK_EQ(counts(place_layers(in)), std::vector<int>({0, 4, 4}));
}

POLICY_TEST(rpc_bad_split_weights_are_one_line_errors) {
    CHECK_THROWS(place_layers(layers(8, {1, 1}, 2)), "--rpc-split needs 3 weights");
    CHECK_THROWS(place_layers(layers(8, {1, -1}, 1)), "weights must be numbers >= 0");
    CHECK_THROWS(place_layers(layers(8, {1, std::nan("")}, 1)), "weights must be numbers >= 0");
    CHECK_THROWS(place_layers(layers(8, {0, 0}, 1)), "a weight of 0");
}

POLICY_TEST(rpc_explicit_share_that_does_not_fit_names_the_worker) {
    PlacementInput in = layers(8, {1, 1, 1}, 2);  // 3, 3, 2 (+ output)
    in.worker_free[1] = 200 * MiB + 10 * MiB + kWorkerReserveBytes;  // exactly fits
    CHECK_EQ(counts(place_layers(in)), std::vector<int>({3, 3, 2}));
    in.worker_free[1] -= 1;
    CHECK_THROWS(place_layers(in), "RPC worker b:2: the split puts 2 layer(s) and the output layer (210 MiB + 64 MiB");
}

POLICY_TEST(rpc_by_memory_a_worker_takes_what_fits_and_the_main_process_the_rest) {
    PlacementInput in = layers(8, {}, 2);
    in.output_bytes = 50 * MiB;
    in.main_free = 400 * MiB;
    in.worker_free = {200 * MiB, 400 * MiB};
    // Shares of 400:200:400 are 3, 2, 3; a fits 1 layer beside its 64 MiB, b 2 and the output.
    const LayerPlacement p = place_layers(in);
    CHECK_EQ(counts(p), std::vector<int>({5, 1, 2}));
    CHECK_EQ(p.worker_bytes, std::vector<uint64_t>({100 * MiB, 250 * MiB}));
    CHECK_EQ(describe(p, in.workers, true), std::string("main 0-4 (streamed); a:1 5; b:2 6-7 + output"));
}

POLICY_TEST(rpc_by_memory_fits_each_worker_on_the_layers_it_gets) {
    // Layers differ (the last is 300 MiB): what fits is judged on each worker's final run, and a
    // placement by memory never fails with "give it a smaller share".
    PlacementInput in = layers(8, {}, 2);
    in.layer_bytes.back() = 300 * MiB;
    in.output_bytes = 50 * MiB;
    in.main_free = 400 * MiB;
    in.worker_free = {264 * MiB, 450 * MiB};
    // Shares of 400:264:450 are 3, 2, 3. b, last, ends with layer 7: 7 and the output fit
    // (300 + 50 + 64 <= 450), 6-7 do not; a ends before b: 5-6 fit (200 + 64 <= 264).
    const LayerPlacement p = place_layers(in);
    CHECK_EQ(counts(p), std::vector<int>({5, 2, 1}));
    CHECK_EQ(p.worker_bytes, std::vector<uint64_t>({200 * MiB, 350 * MiB}));
    CHECK_EQ(describe(p, in.workers, true), std::string("main 0-4 (streamed); a:1 5-6; b:2 7 + output"));
}

POLICY_TEST(rpc_describe_names_every_run) {
    LayerPlacement p;
    p.main_layers = 4;
    p.worker_layers = {2, 2};
    CHECK_EQ(describe(p, {"127.0.0.1:50052", "127.0.0.1:50053"}, true),
             std::string("main 0-3 (streamed); 127.0.0.1:50052 4-5; 127.0.0.1:50053 6-7 + output"));
    p.main_layers = 1;
    p.worker_layers = {0, 7};
    CHECK_EQ(describe(p, {"a", "b"}, false), std::string("main 0; a no layers; b 1-7 + output"));
    p.main_layers = 0;
    CHECK_EQ(describe(p, {"a", "b"}, true), std::string("main no layers; a no layers; b 0-6 + output"));
}
