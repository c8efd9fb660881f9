#include "bmoe/config.h"

namespace bmoe {

const char * to_string(ReadPath path) { return path == ReadPath::ODirect ? "odirect" : "pread"; }
const char * to_string(DenseMode mode) { return mode == DenseMode::Anon ? "anon" : "mmap"; }
const char * to_string(Prefetch prefetch) {
    return prefetch == Prefetch::Predict ? "predict" : prefetch == Prefetch::Auto ? "auto" : "off";
}

}  // namespace bmoe
