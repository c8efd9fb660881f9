#include "bmoe/build_info.h"

#include "ggml-rpc.h"
#include "llama.h"

#ifdef BMOE_HAVE_EXPERT_READY_HOOK
#include "ggml-cpu.h"
#endif

namespace bmoe {

BuildInfo build_info() {
    BuildInfo info;
    info.llama_pin = BMOE_LLAMA_PIN_VERSION;
    info.llama_commit = BMOE_LLAMA_UPSTREAM_COMMIT;
#ifdef BMOE_HAVE_EXPERT_READY_HOOK
    // Taking the address proves the patched symbol is linked in, not merely declared.
    info.expert_ready_hook = &ggml_cpu_set_expert_ready_hook != nullptr;
#endif
#ifdef BMOE_TEST_FAULTS
    info.test_faults = true;
#endif
    info.system_info = llama_print_system_info();
    info.rpc_protocol = std::to_string(RPC_PROTO_MAJOR_VERSION) + "." + std::to_string(RPC_PROTO_MINOR_VERSION) + "." +
                        std::to_string(RPC_PROTO_PATCH_VERSION);
    return info;
}

}  // namespace bmoe
