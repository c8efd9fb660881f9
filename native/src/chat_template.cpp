#include <algorithm>

#include "bmoe/chat.h"
#include "bmoe/error.h"
#include "llama.h"

namespace bmoe {

std::string apply_chat_template(const std::string & tmpl, const std::vector<ChatMessage> & messages,
                                bool add_assistant) {
    std::vector<llama_chat_message> chat;
    chat.reserve(messages.size());
    size_t chars = 0;
    for (const ChatMessage & m : messages) {
        chat.push_back({m.role.c_str(), m.content.c_str()});
        chars += m.role.size() + m.content.size();
    }
    std::string out(std::max<size_t>(256, 2 * chars + 256), '\0');
    for (int attempt = 0; attempt < 2; ++attempt) {
        const int32_t n = llama_chat_apply_template(tmpl.c_str(), chat.data(), chat.size(), add_assistant,
                                                    out.data(), static_cast<int32_t>(out.size()));
        if (n < 0) {
            throw Error("llama.cpp does not recognise this chat template");
        }
        if (static_cast<size_t>(n) <= out.size()) {
            out.resize(static_cast<size_t>(n));
            return out;
        }
        out.assign(static_cast<size_t>(n), '\0');  // too small: llama.cpp said how much it needs
    }
    throw Error("the chat template's output did not fit twice");
}

std::vector<std::string> builtin_chat_templates() {
    std::vector<const char *> names(static_cast<size_t>(llama_chat_builtin_templates(nullptr, 0)));
    llama_chat_builtin_templates(names.data(), names.size());
    return {names.begin(), names.end()};
}

}  // namespace bmoe
