// Conversations through llama.cpp's own chat layer (`common`: its Jinja engine, the ~30 tool-call and
// reasoning formats it knows, its JSON-schema grammars). Nothing of llama.cpp's types shows here:
// messages and tools cross as OpenAI's JSON text, results as plain structs (chat.cpp is the one file
// that includes common's headers).
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace bmoe {

class Engine;

// What to render: OpenAI's shapes as JSON text.
struct ChatInputs {
    std::string messages_json = "[]";  // OpenAI's messages
    std::string tools_json;            // OpenAI's tools ("" = none)
    std::string tool_choice = "auto";  // auto | none | required
    std::string tool_name;             // with required: only this tool may be called (a named tool_choice)
    // With required: the answer starts with the format's tool-call opening (written into the prompt), so the
    // call comes first; otherwise common's grammar lets text come before it, as long as the model likes.
    bool start_with_call = false;
    std::string json_schema;           // response_format's schema ("" = free text; "{}" = any JSON object)
    bool enable_thinking = true;
    bool parallel_tool_calls = false;
    bool add_generation_prompt = true;
    bool continue_final_message = false;  // the last (assistant) message is continued, not answered
    std::string template_kwargs_json;     // an object: more of the template's variables (reasoning_effort, ...)
};

// The rendered prompt and how to sample and read the answer.
struct ChatPrompt {
    std::string prompt;                  // the text to tokenize (control tokens parsed)
    std::string format;                  // common's name of the answer's format
    std::string grammar;                 // GBNF ("" = unconstrained)
    bool grammar_lazy = false;           // the grammar applies from the first trigger on
    std::vector<std::string> triggers;   // regexes that start a lazy grammar
    std::string generation_prompt;       // the assistant turn's opening the grammar and parser start from
                                         // (with start_with_call: the tool call's opening too)
    std::vector<std::string> preserved_tokens;
    std::vector<std::string> additional_stops;
    bool supports_thinking = false;
    std::string parser;                  // the answer's parser (common's serialized PEG arena)
};

// A model's chat templates (its own, or `source`), read once.
class ChatTemplates {
public:
    // The engine's model (its template unless `source`, its BOS/EOS), or `source` alone with the given
    // BOS/EOS text (no model: for checking templates). Throws bmoe::Error when a template does not parse.
    ChatTemplates(const Engine & engine, const std::string & source);
    ChatTemplates(const std::string & source, const std::string & bos, const std::string & eos);
    ~ChatTemplates();
    ChatTemplates(const ChatTemplates &) = delete;
    ChatTemplates & operator=(const ChatTemplates &) = delete;

    // Throws bmoe::Error for a conversation the template or common refuses (its message).
    ChatPrompt apply(const ChatInputs & inputs) const;
    std::string source() const;
    bool explicit_template() const;       // false: neither the model nor the caller gave one (ChatML)
    bool supports_thinking() const;       // the template has a switch for reasoning
    std::vector<std::string> capabilities() const;  // common's caps that hold (supports_tools, ...)

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

struct ChatToolCall {
    std::string name;
    std::string arguments;  // JSON text
    std::string id;         // as the model wrote it ("" = none)
};

// A piece of the answer since the last update: text, reasoning, or one tool call's new part.
struct ChatDelta {
    std::string content;
    std::string reasoning;
    int tool_index = -1;    // >= 0: this piece belongs to that tool call
    std::string name;       // the call's name, in the call's first piece
    std::string id;
    std::string arguments;  // more of its arguments
};

// Reads an answer as it streams (common_chat_parse, partially until the end).
class ChatParser {
public:
    explicit ChatParser(const ChatPrompt & prompt);
    ~ChatParser();
    ChatParser(const ChatParser &) = delete;
    ChatParser & operator=(const ChatParser &) = delete;

    // `text` appended to the answer; `last`: the answer is complete. The pieces new since the last call.
    std::vector<ChatDelta> update(const std::string & text, bool last);
    std::string content() const;
    std::string reasoning() const;
    std::vector<ChatToolCall> tool_calls() const;
    size_t calls_begun() const;  // tool calls the parse has seen begin (also one whose name is not whole yet)

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// GBNF for a JSON schema (common's json_schema_to_grammar); throws bmoe::Error when it cannot.
std::string json_schema_grammar(const std::string & schema_json);

}  // namespace bmoe
