#include "policy/rpc_placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "bmoe/error.h"

namespace bmoe::detail {
namespace {

std::string mib(uint64_t bytes) { return std::to_string((bytes + (1u << 20) - 1) >> 20) + " MiB"; }

// counts[i] of n by weights[i]: floors, then the largest remainders (ties to the earlier one).
std::vector<int> shares(int n, const std::vector<double> & weights) {
    const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
    std::vector<int> counts(weights.size(), 0);
    std::vector<std::pair<double, size_t>> rest;
    int given = 0;
    for (size_t i = 0; i < weights.size(); ++i) {
        const double exact = n * weights[i] / total;
        counts[i] = static_cast<int>(std::floor(exact));
        given += counts[i];
        rest.emplace_back(exact - counts[i], i);
    }
    std::stable_sort(rest.begin(), rest.end(), [](const auto & a, const auto & b) { return a.first > b.first; });
    for (size_t k = 0; given < n; ++k, ++given) {
        ++counts[rest[k % rest.size()].second];
    }
    return counts;
}

uint64_t bytes_of(const PlacementInput & in, int first, int count, bool with_output) {
    uint64_t sum = with_output ? in.output_bytes : 0;
    for (int il = first; il < first + count; ++il) {
        sum += in.layer_bytes[static_cast<size_t>(il)];
    }
    return sum;
}

}  // namespace

LayerPlacement place_layers(const PlacementInput & in) {
    const int n_layer = static_cast<int>(in.layer_bytes.size());
    const size_t n_workers = in.worker_free.size();
    const bool by_memory = in.weights.empty();
    if (!by_memory && in.weights.size() != n_workers + 1) {
        throw Error("--rpc-split needs " + std::to_string(n_workers + 1) + " weights (this machine first, then each of " +
                    std::to_string(n_workers) + " worker(s)), got " + std::to_string(in.weights.size()));
    }
    for (double w : in.weights) {
        if (!(w >= 0) || !std::isfinite(w)) {
            throw Error("--rpc-split weights must be numbers >= 0");
        }
    }
    std::vector<double> weights = in.weights;
    if (by_memory) {
        weights.push_back(static_cast<double>(in.main_free));
        for (uint64_t f : in.worker_free) {
            weights.push_back(static_cast<double>(f));
        }
    }
    if (std::accumulate(weights.begin(), weights.end(), 0.0) <= 0) {
        throw Error("--rpc-split gives every participant a weight of 0");
    }
    std::vector<int> counts = shares(n_layer, weights);
    if (in.main_keeps_one && counts[0] == 0 && n_layer > 0) {  // streaming needs a layer here
        const auto most = std::max_element(counts.begin() + 1, counts.end());
        --*most;
        counts[0] = 1;
    }
    LayerPlacement p;
    p.main_layers = counts[0];
    p.worker_layers.assign(counts.begin() + 1, counts.end());
    p.worker_bytes.assign(n_workers, 0);
    if (by_memory) {
        // At most what fits; the main process streams the rest. A layer handed back goes to the main
        // process, before every run, so the runs after it stay where they are: fit the workers from
        // the last one (its run ends with the last layer) back, each on the layers it will hold.
        int end = n_layer;
        for (size_t w = n_workers; w-- > 0;) {
            const bool last = w + 1 == n_workers;
            int & count = p.worker_layers[w];
            while (count > 0 && bytes_of(in, end - count, count, last) + kWorkerReserveBytes > in.worker_free[w]) {
                --count;
                ++p.main_layers;
            }
            end -= count;
        }
    }
    int first = p.main_layers;
    for (size_t w = 0; w < n_workers; ++w) {
        const bool last = w + 1 == n_workers;
        p.worker_bytes[w] = bytes_of(in, first, p.worker_layers[w], last);
        if (p.worker_bytes[w] + kWorkerReserveBytes > in.worker_free[w]) {
            throw Error("RPC worker " + in.workers[w] + ": the split puts " + std::to_string(p.worker_layers[w]) +
                        " layer(s)" + (last ? " and the output layer" : "") + " (" + mib(p.worker_bytes[w]) + " + " +
                        mib(kWorkerReserveBytes) + " for its KV cache and buffers) on it, but it has " +
                        mib(in.worker_free[w]) + " free; give it a smaller share with --rpc-split");
        }
        first += p.worker_layers[w];
    }
    return p;
}

std::string describe(const LayerPlacement & p, const std::vector<std::string> & workers, bool streamed) {
    auto run = [](int first, int count) {
        return count == 0 ? std::string("no layers")
               : count == 1 ? std::to_string(first)
                            : std::to_string(first) + "-" + std::to_string(first + count - 1);
    };
    std::string out = "main " + run(0, p.main_layers) + (streamed && p.main_layers > 0 ? " (streamed)" : "");
    int first = p.main_layers;
    for (size_t w = 0; w < p.worker_layers.size(); ++w) {
        out += "; " + workers[w] + " " + run(first, p.worker_layers[w]) + (w + 1 == p.worker_layers.size() ? " + output" : "");
        first += p.worker_layers[w];
    }
    return out;
}

}  // namespace bmoe::detail
