// What llama.cpp would abort on (GGML_ASSERT) in a model's metadata, checked before it loads the
// file, so a corrupt or hostile model is a one-line error instead of a core dump. Each check
// mirrors one assert of the pinned llama.cpp, named in the .cpp; the fuzz campaign
// (bmoe_edge/proof/fuzz.py) is how new ones are found.
#pragma once

#include <string>

struct gguf_context;

namespace bmoe::detail {

// Throws bmoe::Error naming the file and what is wrong.
void check_before_load(const gguf_context * ctx, const std::string & path, const std::string & architecture);

}  // namespace bmoe::detail
