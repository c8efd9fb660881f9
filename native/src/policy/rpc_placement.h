// Which whole layers go to which RPC worker (policy only: plain numbers in, counts out).
//
// llama.cpp places layers by device in order: the first layers stay on this process's CPU, the rest
// go to the devices one after the other, and the output layer goes with the last. So a placement is
// a count per participant: the main process's first, then each worker's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bmoe::detail {

struct PlacementInput {
    std::vector<uint64_t> layer_bytes;   // every repeating layer's weights (blk.N.*), in order
    uint64_t output_bytes = 0;           // the output layer's (output.weight, output_norm.weight)
    std::vector<double> weights;         // main first, then each worker; empty = by memory
    uint64_t main_free = 0;              // what the main process could hold (MemAvailable, or its cgroup's)
    std::vector<uint64_t> worker_free;   // what each worker reports free
    std::vector<std::string> workers;    // their names, for errors
    bool main_keeps_one = true;          // streaming: the main process keeps at least one layer
};

struct LayerPlacement {
    int main_layers = 0;                 // layers [0, main_layers) stay in this process
    std::vector<int> worker_layers;      // then each worker's run of layers, in order
    std::vector<uint64_t> worker_bytes;  // the weights each worker will hold (the last: + output)
};

// Bytes a worker needs beyond its layers' weights: its share of the KV cache and compute buffers.
constexpr uint64_t kWorkerReserveBytes = 64ull << 20;

// Largest-remainder shares of the layers by weight. With explicit weights a worker that cannot hold
// its share is an error naming it; by memory (no weights) a worker gets at most what fits and the
// main process keeps the rest. Throws bmoe::Error with one line.
LayerPlacement place_layers(const PlacementInput & in);

// "main 0-3 (streamed); 127.0.0.1:50052 4-5; 127.0.0.1:50053 6-7 + output"
std::string describe(const LayerPlacement & p, const std::vector<std::string> & workers, bool streamed);

}  // namespace bmoe::detail
