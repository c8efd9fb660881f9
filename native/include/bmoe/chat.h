// Chat templates through llama.cpp's own template engine (llama_chat_apply_template: the built-in
// templates it recognises from a model's tokenizer.chat_template, no Jinja interpreter).
#pragma once

#include <string>
#include <vector>

namespace bmoe {

struct ChatMessage {
    std::string role;     // "system", "user", "assistant", ...
    std::string content;
};

// Render `messages` with `tmpl` (a Jinja source as stored in a gguf, or a built-in name such as
// "chatml"); `add_assistant` ends the text with the opening of the assistant's turn. Throws
// bmoe::Error when llama.cpp does not recognise the template.
std::string apply_chat_template(const std::string & tmpl, const std::vector<ChatMessage> & messages,
                                bool add_assistant);

// The names of llama.cpp's built-in templates.
std::vector<std::string> builtin_chat_templates();

}  // namespace bmoe
