// The one file that includes llama.cpp's `common` chat layer: templates rendered by its Jinja engine,
// the grammar and lazy triggers for tool calls and response_format, and the answer parsed back into
// reasoning, content and tool calls (incrementally while it streams). `common` is not a stable API:
// a pin bump that changes it fails to build here, or fails tests/test_templates.py.
#include <exception>
#include <functional>
#include <utility>

#include "bmoe/chat.h"
#include "bmoe/engine.h"
#include "bmoe/error.h"
#include "chat.h"  // llama.cpp common/
#include "engine/model.h"
#include "engine/tokens.h"
#include "json-schema-to-grammar.h"
#include "peg-parser.h"

namespace bmoe {

namespace {

// common reports a conversation it refuses, a template that fails and a schema it cannot convert by
// throwing std::exception (nlohmann's among them): each becomes one line of `Refusal`, a RequestError where
// what common refused is the request's (a conversation, tools, a schema), an Error where it is the model's or
// the server's (a template that does not parse).
template <typename Refusal = Error, typename F>
auto refused(const char * what, F && f) -> decltype(f()) {
    try {
        return f();
    } catch (const Error &) {
        throw;
    } catch (const std::exception & e) {
        std::string msg = e.what();
        if (msg.size() > 600) {  // a template's whole source or a long schema in the message: its start
            msg = msg.substr(0, 600) + "...";
        }
        throw Refusal(std::string(what) + ": " + msg);
    }
}

common_chat_tool_choice tool_choice(const std::string & name) {
    if (name == "auto") return COMMON_CHAT_TOOL_CHOICE_AUTO;
    if (name == "none") return COMMON_CHAT_TOOL_CHOICE_NONE;
    if (name == "required") return COMMON_CHAT_TOOL_CHOICE_REQUIRED;
    throw RequestError("tool_choice must be auto, none or required, got '" + name + "'");
}

// A trigger as the lazy grammar sampler takes it (llama_sampler_init_grammar_lazy_patterns): a regex.
// The same mapping as common_sampler_init's.
std::string trigger_pattern(const common_grammar_trigger & t) {
    switch (t.type) {
        case COMMON_GRAMMAR_TRIGGER_TYPE_WORD:
        case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN:  // the token's text: the sampler sees its piece
            return regex_escape(t.value);
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN:
            return t.value;
        case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: {
            if (t.value.empty()) return "^$";
            return (t.value.front() != '^' ? "^" : "") + t.value + (t.value.back() != '$' ? "$" : "");
        }
    }
    throw Error("common returned a grammar trigger of an unknown type");
}

// `text` is the start of an answer the format's parser (common's serialized PEG arena) can go on from.
bool answer_begins(const std::string & parser, const std::string & text) {
    common_peg_arena arena;
    arena.load(parser);
    common_peg_parse_context ctx(text, COMMON_PEG_PARSE_FLAG_LENIENT);  // lenient: the input may stop short
    return !arena.parse(ctx).fail();
}

common_chat_templates_inputs to_common(const ChatInputs & in, const common_json & tools) {
    common_chat_templates_inputs out;
    out.messages = common_chat_msgs_parse_oaicompat(common_json::parse(in.messages_json));
    if (!tools.is_null()) {
        out.tools = common_chat_tools_parse_oaicompat(tools);
    }
    out.tool_choice = tool_choice(in.tool_choice);
    out.json_schema = in.json_schema;
    out.add_generation_prompt = in.add_generation_prompt && !in.continue_final_message;
    out.continue_final_message =
        in.continue_final_message ? COMMON_CHAT_CONTINUATION_AUTO : COMMON_CHAT_CONTINUATION_NONE;
    out.parallel_tool_calls = in.parallel_tool_calls;
    // Reasoning is always read apart from the answer (reasoning_content), never left in the text.
    out.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
    out.enable_thinking = in.enable_thinking;
    if (!in.template_kwargs_json.empty()) {
        const common_json kwargs = common_json::parse(in.template_kwargs_json);  // outlives the loop over it
        if (!kwargs.is_object()) {
            throw RequestError("the template's variables must be a JSON object");
        }
        for (const auto & [key, value] : kwargs.items()) {
            out.chat_template_kwargs[key] = value.dump();
        }
    }
    return out;
}

}  // namespace

struct ChatTemplates::Impl {
    common_chat_templates_ptr templates;

    // The format's tool-call opening is the word that starts `auto`'s lazy grammar: written after the
    // assistant turn's opening, it is where the grammar and the parser then start from.
    void start_with_call(common_chat_params & p, const ChatInputs & in, const common_json & tools) const {
        ChatInputs lazy = in;
        lazy.tool_choice = "auto";
        const common_chat_params free = common_chat_templates_apply(templates.get(), to_common(lazy, tools));
        for (const auto & t : free.grammar_triggers) {
            if (t.type == COMMON_GRAMMAR_TRIGGER_TYPE_WORD && !t.value.empty()) {
                // A template that opens the reasoning itself (MiniMax-M2: "<think>\n") gets it closed first:
                // the call is the answer, after an empty reasoning.
                std::string opening;
                const std::string & gen = p.generation_prompt;
                const size_t start = p.thinking_start_tag.empty() ? std::string::npos : gen.rfind(p.thinking_start_tag);
                if (start != std::string::npos && !p.thinking_end_tags.empty() &&
                    gen.find(p.thinking_end_tags[0], start) == std::string::npos) {
                    // With the line break a template writes after it (MiniMax-M2), unless the format's own
                    // parser (and so its grammar, built from the same rules) takes none there (Cohere2MoE).
                    opening = p.thinking_end_tags[0] + "\n";
                    if (!p.parser.empty() && !answer_begins(p.parser, gen + opening + t.value) &&
                        answer_begins(p.parser, gen + p.thinking_end_tags[0] + t.value)) {
                        opening = p.thinking_end_tags[0];
                    }
                }
                p.prompt += opening + t.value;
                p.generation_prompt += opening + t.value;
                return;
            }
        }
        // No word starts a call (gpt-oss's Harmony, bare-JSON formats): the template's own rendering of a
        // call says what comes before its name; written after the assistant turn's opening, the grammar
        // (which follows the same template) goes on from there.
        if (tools.empty()) {
            return;
        }
        const std::string name = in.tool_name.empty() ? tools[0]["function"].value("name", "") : in.tool_name;
        common_json messages = common_json::parse(in.messages_json);
        common_json call = common_json::object();
        call["id"] = "abcdefghi";  // Mistral's templates take 9 letters and digits only
        call["type"] = "function";
        call["function"] = common_json::object();
        call["function"]["name"] = name;
        call["function"]["arguments"] = "{}";
        common_json turn_msg = common_json::object();
        turn_msg["role"] = "assistant";
        turn_msg["content"] = "";
        turn_msg["tool_calls"] = common_json::array();
        turn_msg["tool_calls"].push_back(call);
        messages.push_back(turn_msg);
        ChatInputs past = lazy;
        past.messages_json = messages.dump();
        past.add_generation_prompt = false;
        const std::string with_call = common_chat_templates_apply(templates.get(), to_common(past, tools)).prompt;
        const std::string base = p.prompt.substr(0, p.prompt.size() - p.generation_prompt.size());
        if (with_call.compare(0, base.size(), base) != 0) {
            return;
        }
        const std::string turn = with_call.substr(base.size());
        const size_t at = turn.find(name);
        if (turn.compare(0, p.generation_prompt.size(), p.generation_prompt) != 0 || at == std::string::npos ||
            at < p.generation_prompt.size()) {
            return;
        }
        // A named call is written up to its arguments (the rendered "{}"): its header is the template's too.
        size_t end = at;
        if (!in.tool_name.empty()) {
            const size_t args = turn.find("{}", at + name.size());
            end = args == std::string::npos ? at : args;
        }
        const std::string opening = turn.substr(p.generation_prompt.size(), end - p.generation_prompt.size());
        p.prompt += opening;
        p.generation_prompt += opening;
    }
};

ChatTemplates::ChatTemplates(const Engine & engine, const std::string & source) : impl_(std::make_unique<Impl>()) {
    const llama_model * model = engine.model().get();
    impl_->templates = refused("the chat template does not parse",
                               [&] { return common_chat_templates_init(model, source); });
}

ChatTemplates::ChatTemplates(const std::string & source, const std::string & bos, const std::string & eos)
    : impl_(std::make_unique<Impl>()) {
    impl_->templates = refused("the chat template does not parse",
                               [&] { return common_chat_templates_init(nullptr, source, bos, eos); });
}

ChatTemplates::~ChatTemplates() = default;

ChatPrompt ChatTemplates::apply(const ChatInputs & in) const {
    return refused<RequestError>("the chat template refused the conversation", [&] {
        common_json tools = in.tools_json.empty() ? common_json() : common_json::parse(in.tools_json);
        common_chat_params p = common_chat_templates_apply(impl_->templates.get(), to_common(in, tools));
        if (!in.tool_name.empty()) {
            // A named tool_choice: the model sees every tool, the grammar (and parser) allow only this one.
            common_json only = common_json::array();
            for (const auto & t : tools) {
                if (t.contains("function") && t["function"].value("name", "") == in.tool_name) {
                    only.push_back(t);
                }
            }
            if (only.empty()) {
                throw RequestError("tool_choice names '" + in.tool_name + "', which is not one of the tools");
            }
            common_chat_params forced = common_chat_templates_apply(impl_->templates.get(), to_common(in, only));
            forced.prompt = p.prompt;
            p = std::move(forced);
        }
        if (in.start_with_call && in.tool_choice == "required") {
            impl_->start_with_call(p, in, tools);
        }
        ChatPrompt out;
        out.prompt = p.prompt;
        out.format = common_chat_format_name(p.format);
        out.grammar = p.grammar;
        out.grammar_lazy = p.grammar_lazy;
        for (const auto & t : p.grammar_triggers) {
            out.triggers.push_back(trigger_pattern(t));
        }
        out.generation_prompt = p.generation_prompt;
        out.preserved_tokens = p.preserved_tokens;
        out.additional_stops = p.additional_stops;
        out.supports_thinking = p.supports_thinking;
        out.parser = p.parser;
        return out;
    });
}

std::string ChatTemplates::source() const { return common_chat_templates_source(impl_->templates.get()); }

bool ChatTemplates::explicit_template() const { return common_chat_templates_was_explicit(impl_->templates.get()); }

bool ChatTemplates::supports_thinking() const {
    return refused("the chat template failed",
                   [&] { return common_chat_templates_support_enable_thinking(impl_->templates.get()); });
}

std::vector<std::string> ChatTemplates::capabilities() const {
    std::vector<std::string> out;
    for (const auto & [name, holds] : common_chat_templates_get_caps(impl_->templates.get())) {
        if (holds) {
            out.push_back(name);
        }
    }
    return out;
}

struct ChatParser::Impl {
    common_chat_parser_params params;
    std::string text;
    common_chat_msg msg;  // the answer as last read
    // What has been handed out: each piece is the rest of the parse past these, so the pieces add up to
    // the answer exactly, streamed or not (a parse that takes back text already handed out hands nothing).
    std::string sent_content, sent_reasoning;
    std::vector<std::string> sent_args;
    std::vector<bool> sent_name;
};

namespace {

// The part of `now` past `sent`, when `now` extends it; moves `sent` on.
bool advance(std::string & sent, const std::string & now, std::string & piece) {
    if (now.size() <= sent.size() || now.compare(0, sent.size(), sent) != 0) {
        return false;
    }
    piece = now.substr(sent.size());
    sent = now;
    return true;
}

}  // namespace

ChatParser::ChatParser(const ChatPrompt & prompt) : impl_(std::make_unique<Impl>()) {
    refused("the chat format's parser does not load", [&] {
        common_chat_parser_params & p = impl_->params;
        p.format = COMMON_CHAT_FORMAT_PEG_NATIVE;
        for (int f = 0; f < COMMON_CHAT_FORMAT_COUNT; ++f) {
            if (prompt.format == common_chat_format_name(static_cast<common_chat_format>(f))) {
                p.format = static_cast<common_chat_format>(f);
            }
        }
        p.reasoning_format = COMMON_REASONING_FORMAT_DEEPSEEK;
        p.generation_prompt = prompt.generation_prompt;
        p.parse_tool_calls = true;
        if (!prompt.parser.empty()) {
            p.parser.load(prompt.parser);
        }
        return 0;
    });
}

ChatParser::~ChatParser() = default;

std::vector<ChatDelta> ChatParser::update(const std::string & text, bool last) {
    Impl & d = *impl_;
    d.text += text;
    std::vector<ChatDelta> out;
    try {
        d.msg = common_chat_parse(d.text, !last, d.params);
    } catch (const std::exception &) {
        // Text common cannot read (yet): what was read stands; the next update reads it all again. At the
        // end, text that never parsed is the answer's text.
        if (!last) {
            return out;
        }
        d.msg = common_chat_msg();
        d.msg.content = d.text;
    }
    ChatDelta piece;
    if (advance(d.sent_reasoning, d.msg.reasoning_content, piece.reasoning)) {
        out.push_back(std::move(piece));
        piece = ChatDelta();
    }
    if (advance(d.sent_content, d.msg.content, piece.content)) {
        out.push_back(std::move(piece));
        piece = ChatDelta();
    }
    const auto & calls = d.msg.tool_calls;
    for (size_t i = 0; i < calls.size(); ++i) {
        if (d.sent_args.size() <= i) {
            d.sent_args.emplace_back();
            d.sent_name.push_back(false);
        }
        ChatDelta call;
        call.tool_index = static_cast<int>(i);
        if (!d.sent_name[i]) {
            // A name may still grow while it is the last thing read: it goes out once whole.
            if (!last && i + 1 == calls.size() && calls[i].arguments.empty()) {
                break;
            }
            d.sent_name[i] = true;
            call.name = calls[i].name;
            call.id = calls[i].id;
            advance(d.sent_args[i], calls[i].arguments, call.arguments);
            out.push_back(std::move(call));
        } else if (advance(d.sent_args[i], calls[i].arguments, call.arguments)) {
            out.push_back(std::move(call));
        }
    }
    return out;
}

std::string ChatParser::content() const { return impl_->sent_content; }

std::string ChatParser::reasoning() const { return impl_->sent_reasoning; }

std::vector<ChatToolCall> ChatParser::tool_calls() const {
    std::vector<ChatToolCall> out;
    const auto & calls = impl_->msg.tool_calls;
    for (size_t i = 0; i < impl_->sent_name.size() && i < calls.size(); ++i) {
        if (impl_->sent_name[i]) {
            out.push_back({calls[i].name, impl_->sent_args[i], calls[i].id});
        }
    }
    return out;
}

size_t ChatParser::calls_begun() const { return impl_->msg.tool_calls.size(); }

std::string json_schema_grammar(const std::string & schema_json) {
    return refused<RequestError>("the JSON schema cannot be turned into a grammar",
                   [&] { return json_schema_to_grammar(common_json::parse(schema_json)); });
}

}  // namespace bmoe
