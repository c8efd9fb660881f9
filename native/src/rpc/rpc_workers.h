// The workers of llama.cpp's RPC backend (ggml-rpc): each `host:port` registered as a device, asked
// for its memory, and handed to llama.cpp's own layer placement (llama_model_params.devices and
// tensor_split). The endpoints must have been probed first (bmoe_edge.engine.rpc): ggml-rpc aborts
// the process on a worker it cannot reach or speak to.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "model/gguf_map.h"
#include "policy/rpc_placement.h"

struct ggml_backend_device;

namespace bmoe::detail {

// While it lives, ggml's abort handler is ours (one line naming the worker that went away, exit 1)
// and knows these endpoints; the last one to go gives the handler back.
class AbortRegistration {
public:
    explicit AbortRegistration(const std::vector<std::string> & endpoints);
    ~AbortRegistration();
    AbortRegistration(const AbortRegistration &) = delete;
    AbortRegistration & operator=(const AbortRegistration &) = delete;

private:
    std::vector<std::string> endpoints_;
};

class RpcWorkers {
public:
    // Registers every endpoint (connects to it) and reads its memory. From here on a worker that
    // fails makes ggml-rpc abort: the abort handler prints one line naming the worker(s) that stopped
    // answering and ends the process (ggml-rpc cannot return an error from inside a decode).
    // `deadline_s` > 0: a decode that has not returned after that long ends the process with one
    // line (a stopped worker or a lost network leaves ggml-rpc waiting forever on its socket).
    RpcWorkers(const std::vector<std::string> & endpoints, double deadline_s);
    ~RpcWorkers();
    RpcWorkers(const RpcWorkers &) = delete;
    RpcWorkers & operator=(const RpcWorkers &) = delete;

    // Arms the decode deadline for as long as it lives.
    class Watch {
    public:
        explicit Watch(RpcWorkers * workers);
        ~Watch();
        Watch(const Watch &) = delete;
        Watch & operator=(const Watch &) = delete;
    private:
        RpcWorkers * workers_;
    };

    // The placement for this model: layer sizes from the file's tensor table, shares by `weights`
    // (main first; empty = by memory). Throws bmoe::Error naming a worker that cannot hold its share.
    LayerPlacement place(const GgufMap & gguf, const std::vector<double> & weights, bool streaming) const;

    // llama_model_params.devices (null-terminated) and tensor_split (llama_max_devices() long) for
    // `placement`; n_gpu_layers is what llama.cpp offloads: the workers' layers and the output layer.
    std::vector<ggml_backend_device *> devices() const;
    static std::vector<float> tensor_split(const LayerPlacement & placement, size_t max_devices);
    static int offloaded_layers(const LayerPlacement & placement);

    const std::vector<std::string> & endpoints() const { return endpoints_; }

    // Bytes this process has sent to and received from its workers so far (TCP_INFO's bytes_acked +
    // bytes_received over every socket connected to one of them): a step's difference is its
    // network traffic. 0 where the kernel does not say.
    uint64_t network_bytes() const;

private:
    std::vector<std::string> endpoints_;
    AbortRegistration abort_;  // before anything can abort: the first connection
    std::vector<ggml_backend_device *> devices_;
    std::vector<uint64_t> free_;
    std::vector<std::string> peers_;  // the endpoints as getpeername() says them

    void watchdog();
    double deadline_s_ = 0;
    std::mutex mutex_;
    std::condition_variable wake_;
    bool stop_ = false;
    bool armed_ = false;
    std::chrono::steady_clock::time_point since_;
    std::thread thread_;
};

// The endpoints among `endpoints` that refuse a TCP connection within `timeout_ms` (for the abort
// message: which worker went away).
std::vector<std::string> unreachable(const std::vector<std::string> & endpoints, int timeout_ms);

}  // namespace bmoe::detail
