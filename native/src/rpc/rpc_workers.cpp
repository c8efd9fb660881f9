#include "rpc/rpc_workers.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/tcp.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "bmoe/error.h"
#include "model/expert_names.h"
#include "policy/memory_budget.h"
#include "core/telemetry.h"
#include "ggml-backend.h"
#include "ggml-rpc.h"

namespace bmoe::detail {
namespace {

std::mutex g_endpoints_mutex;
std::vector<std::string> g_endpoints;  // every worker of the process, for the abort handler
ggml_abort_callback_t g_previous_abort = nullptr;

struct AddrinfoDeleter {
    void operator()(addrinfo * a) const { freeaddrinfo(a); }
};
using Addresses = std::unique_ptr<addrinfo, AddrinfoDeleter>;

// "host:port" resolved for a TCP connection; empty when it does not resolve.
Addresses resolve(const std::string & endpoint) {
    const size_t colon = endpoint.rfind(':');
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo * res = nullptr;
    if (colon == std::string::npos ||
        getaddrinfo(endpoint.substr(0, colon).c_str(), endpoint.substr(colon + 1).c_str(), &hints, &res) != 0) {
        return nullptr;
    }
    return Addresses(res);
}

bool refuses(const std::string & endpoint, int timeout_ms) {
    const Addresses addresses = resolve(endpoint);
    if (!addresses) {
        return true;
    }
    const addrinfo * res = addresses.get();
    const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    bool ok = false;
    if (fd >= 0) {
        if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
            ok = true;
        } else if (errno == EINPROGRESS) {
            pollfd p{fd, POLLOUT, 0};
            int err = 0;
            socklen_t len = sizeof(err);
            ok = poll(&p, 1, timeout_ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
        }
        close(fd);
    }
    return !ok;
}

// ggml-rpc aborts on a broken connection ("Remote RPC server crashed or returned malformed
// response"): say which worker in one line and end the process without a core dump or backtrace
// (fatal_exit: the server hears it first).
void on_ggml_abort(const char * message) {
    std::vector<std::string> endpoints;
    {
        std::lock_guard<std::mutex> lock(g_endpoints_mutex);
        endpoints = g_endpoints;
    }
    std::string why = message != nullptr ? message : "";
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) {
        why.pop_back();
    }
    const size_t nl = why.find('\n');
    why = nl == std::string::npos ? why : why.substr(0, nl);
    // A killed worker's connection can break before its listening socket closes (the kernel tears a
    // dying process down while its backlog still completes handshakes): probe again for a moment
    // before saying that every worker still answers.
    std::string gone;
    for (int attempt = 0; attempt < 8 && gone.empty(); ++attempt) {
        if (attempt > 0) {
            std::this_thread::sleep_for(std::chrono::milliseconds(250));
        }
        for (const auto & e : unreachable(endpoints, 1000)) {
            gone += (gone.empty() ? "" : ", ") + e;
        }
    }
    std::string all;
    for (const auto & e : endpoints) {
        all += (all.empty() ? "" : ", ") + e;
    }
    fatal_exit(gone.empty()
        ? "error: llama.cpp stopped the run: " + why + " (RPC workers " + all + ")"
        : "error: RPC worker " + gone + " stopped answering during the run (" + why +
              "); restart it (bmoe-edge rpc-worker) and run again");
}

// "host:port" of a connected TCP socket's peer, numeric; "" for anything else.
std::string peer_of(int fd) {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (getpeername(fd, reinterpret_cast<sockaddr *>(&addr), &len) != 0) {
        return "";
    }
    char host[NI_MAXHOST];
    char port[NI_MAXSERV];
    if (getnameinfo(reinterpret_cast<sockaddr *>(&addr), len, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        return "";
    }
    return std::string(host) + ":" + port;
}

// The numeric "address:port" forms of an endpoint (what getpeername will say).
std::vector<std::string> numeric_forms(const std::string & endpoint) {
    std::vector<std::string> out;
    const Addresses addresses = resolve(endpoint);
    for (const addrinfo * a = addresses.get(); a != nullptr; a = a->ai_next) {
        char host[NI_MAXHOST];
        char port[NI_MAXSERV];
        if (getnameinfo(a->ai_addr, a->ai_addrlen, host, sizeof(host), port, sizeof(port),
                        NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
            out.push_back(std::string(host) + ":" + port);
        }
    }
    return out;
}

// What this process may still use: the machine's MemAvailable, or less where a memory cgroup limits
// it (a service's MemoryMax=, a container, a benchmark's cap) — the same kind of number a worker
// reports (rpc-worker reports its own cgroup's limit), so layers are placed by like against like.
uint64_t main_free() {
    const MemoryReading m = read_memory();
    int64_t free = static_cast<int64_t>(std::min<uint64_t>(m.mem_available, INT64_MAX));
    for (const CgroupMemory & c : m.cgroups) {
        free = std::min(free, BudgetPolicy::cgroup_free(c, m));
    }
    return free > 0 ? static_cast<uint64_t>(free) : 0;
}

}  // namespace

std::vector<std::string> unreachable(const std::vector<std::string> & endpoints, int timeout_ms) {
    std::vector<std::string> out;
    for (const auto & e : endpoints) {
        if (refuses(e, timeout_ms)) {
            out.push_back(e);
        }
    }
    return out;
}

AbortRegistration::AbortRegistration(const std::vector<std::string> & endpoints) : endpoints_(endpoints) {
    std::lock_guard<std::mutex> lock(g_endpoints_mutex);
    if (g_endpoints.empty()) {  // the first engine with workers: ours until the last one closes
        g_previous_abort = ggml_set_abort_callback(&on_ggml_abort);
    }
    g_endpoints.insert(g_endpoints.end(), endpoints.begin(), endpoints.end());
}

AbortRegistration::~AbortRegistration() {
    std::lock_guard<std::mutex> lock(g_endpoints_mutex);
    for (const auto & e : endpoints_) {
        const auto it = std::find(g_endpoints.begin(), g_endpoints.end(), e);
        if (it != g_endpoints.end()) {
            g_endpoints.erase(it);
        }
    }
    if (g_endpoints.empty()) {  // the last engine with workers: llama.cpp's own abort again
        ggml_set_abort_callback(g_previous_abort);
    }
}

RpcWorkers::RpcWorkers(const std::vector<std::string> & endpoints, double deadline_s)
    : endpoints_(endpoints), abort_(endpoints), deadline_s_(deadline_s) {
    for (const auto & e : endpoints) {
        for (auto & form : numeric_forms(e)) {
            peers_.push_back(std::move(form));
        }
        ggml_backend_reg_t reg = ggml_backend_rpc_add_server(e.c_str());
        if (reg == nullptr || ggml_backend_reg_dev_count(reg) == 0) {
            throw Error("RPC worker " + e + " has no device to compute on");
        }
        ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, 0);
        size_t free = 0;
        size_t total = 0;
        ggml_backend_dev_memory(dev, &free, &total);
        devices_.push_back(dev);
        free_.push_back(free);
    }
    if (deadline_s_ > 0) {
        thread_ = std::thread([this] { watchdog(); });
    }
}

RpcWorkers::~RpcWorkers() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) {
        thread_.join();
    }
}

RpcWorkers::Watch::Watch(RpcWorkers * workers) : workers_(workers) {
    if (workers_ != nullptr) {
        std::lock_guard<std::mutex> lock(workers_->mutex_);
        workers_->armed_ = true;
        workers_->since_ = std::chrono::steady_clock::now();
    }
    if (workers_ != nullptr) {
        workers_->wake_.notify_all();
    }
}

RpcWorkers::Watch::~Watch() {
    if (workers_ != nullptr) {
        std::lock_guard<std::mutex> lock(workers_->mutex_);
        workers_->armed_ = false;
    }
}

void RpcWorkers::watchdog() {
    const auto limit = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(deadline_s_));
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
        if (!armed_) {
            wake_.wait(lock);
            continue;
        }
        const auto due = since_ + limit;
        if (wake_.wait_until(lock, due) == std::cv_status::timeout && armed_ && !stop_ &&
            std::chrono::steady_clock::now() >= since_ + limit) {
            std::string all;
            for (const auto & e : endpoints_) {
                all += (all.empty() ? "" : ", ") + e;
            }
            char secs[32];
            std::snprintf(secs, sizeof(secs), "%g", deadline_s_);
            lock.unlock();
            fatal_exit("error: a decode waited " + std::string(secs) + " s for the RPC workers (" + all +
                       ") without an answer: a worker stopped or the network is gone; restart it and run again "
                       "(or raise --rpc-timeout)");
        }
    }
}

LayerPlacement RpcWorkers::place(const GgufMap & gguf, const std::vector<double> & weights, bool streaming) const {
    PlacementInput in;
    for (const auto & [name, loc] : gguf.tensors()) {
        if (const int block = block_of(name); block >= 0) {
            const auto il = static_cast<size_t>(block);
            if (il < 4096) {
                in.layer_bytes.resize(std::max(in.layer_bytes.size(), il + 1), 0);
                in.layer_bytes[il] += loc.size;
            }
        } else if (name.rfind("output", 0) == 0) {
            in.output_bytes += loc.size;
        }
    }
    in.weights = weights;
    in.main_free = main_free();
    in.worker_free = free_;
    in.workers = endpoints_;
    in.main_keeps_one = streaming;
    return place_layers(in);
}

uint64_t RpcWorkers::network_bytes() const {
    DIR * dir = opendir("/proc/self/fd");
    if (dir == nullptr) {
        return 0;
    }
    uint64_t total = 0;
    while (const dirent * e = readdir(dir)) {
        char * end = nullptr;
        const long fd = std::strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) {
            continue;
        }
        const std::string peer = peer_of(static_cast<int>(fd));
        if (peer.empty() || std::find(peers_.begin(), peers_.end(), peer) == peers_.end()) {
            continue;
        }
        tcp_info info{};
        socklen_t len = sizeof(info);
        if (getsockopt(static_cast<int>(fd), IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
            len >= offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received)) {
            total += info.tcpi_bytes_acked + info.tcpi_bytes_received;
        }
    }
    closedir(dir);
    return total;
}

std::vector<ggml_backend_device *> RpcWorkers::devices() const {
    std::vector<ggml_backend_device *> out = devices_;
    out.push_back(nullptr);
    return out;
}

std::vector<float> RpcWorkers::tensor_split(const LayerPlacement & p, size_t max_devices) {
    std::vector<float> split(std::max(max_devices, p.worker_layers.size()), 0.0f);
    for (size_t w = 0; w < p.worker_layers.size(); ++w) {
        // llama.cpp counts the output layer as one more layer, on the last device
        split[w] = static_cast<float>(p.worker_layers[w] + (w + 1 == p.worker_layers.size() ? 1 : 0));
    }
    return split;
}

int RpcWorkers::offloaded_layers(const LayerPlacement & p) {
    int n = 1;  // the output layer
    for (int c : p.worker_layers) {
        n += c;
    }
    return n;
}

}  // namespace bmoe::detail
