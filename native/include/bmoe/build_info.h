// What this build of the engine carries: the llama.cpp pin and whether the hook is compiled in.
#pragma once

#include <string>

namespace bmoe {

struct BuildInfo {
    std::string llama_pin;           // e.g. "llama-cpp-python==0.3.36"
    std::string llama_commit;        // upstream llama.cpp commit of the pin
    bool expert_ready_hook = false;  // patch 0001 compiled in (I/O-compute overlap possible)
    std::string system_info;         // llama_print_system_info(): the CPU features ggml was built for
    std::string rpc_protocol;        // ggml-rpc's protocol version "major.minor.patch" (a worker must match)
    bool test_faults = false;        // a test build (BMOE_TEST_FAULTS): BMOE_FAULT honoured, serve's test routes on
};

BuildInfo build_info();

}  // namespace bmoe
