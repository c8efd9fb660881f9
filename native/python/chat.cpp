// Bindings of the chat layer (bmoe/chat.h: llama.cpp's common behind the engine's own types).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bmoe/chat.h"
#include "bmoe/engine.h"

namespace nb = nanobind;

#define BMOE_RW(cls, field) .def_rw(#field, &bmoe::cls::field)
#define BMOE_RO(cls, field) .def_ro(#field, &bmoe::cls::field)

void bind_chat(nb::module_ & m) {
    nb::class_<bmoe::ChatInputs>(m, "ChatInputs")
        .def(nb::init<>())
        BMOE_RW(ChatInputs, messages_json) BMOE_RW(ChatInputs, tools_json) BMOE_RW(ChatInputs, tool_choice)
        BMOE_RW(ChatInputs, tool_name) BMOE_RW(ChatInputs, start_with_call) BMOE_RW(ChatInputs, json_schema)
        BMOE_RW(ChatInputs, enable_thinking)
        BMOE_RW(ChatInputs, parallel_tool_calls) BMOE_RW(ChatInputs, add_generation_prompt)
        BMOE_RW(ChatInputs, continue_final_message) BMOE_RW(ChatInputs, template_kwargs_json);
    nb::class_<bmoe::ChatPrompt>(m, "ChatPrompt")
        BMOE_RO(ChatPrompt, prompt) BMOE_RO(ChatPrompt, format) BMOE_RO(ChatPrompt, grammar)
        BMOE_RO(ChatPrompt, grammar_lazy) BMOE_RO(ChatPrompt, triggers) BMOE_RO(ChatPrompt, generation_prompt)
        BMOE_RO(ChatPrompt, preserved_tokens) BMOE_RO(ChatPrompt, additional_stops)
        BMOE_RO(ChatPrompt, supports_thinking) BMOE_RO(ChatPrompt, parser);
    nb::class_<bmoe::ChatTemplates>(m, "ChatTemplates")
        // the model is read once, when the templates are made: no reference to the engine is kept
        .def(nb::init<const bmoe::Engine &, const std::string &>(), nb::arg("engine"), nb::arg("source") = "")
        .def(nb::init<const std::string &, const std::string &, const std::string &>(), nb::arg("source"),
             nb::arg("bos"), nb::arg("eos"))
        .def("apply", &bmoe::ChatTemplates::apply, nb::arg("inputs"), nb::call_guard<nb::gil_scoped_release>())
        .def_prop_ro("source", &bmoe::ChatTemplates::source)
        .def_prop_ro("explicit_template", &bmoe::ChatTemplates::explicit_template)
        .def_prop_ro("supports_thinking", &bmoe::ChatTemplates::supports_thinking)
        .def_prop_ro("capabilities", &bmoe::ChatTemplates::capabilities);
    nb::class_<bmoe::ChatToolCall>(m, "ChatToolCall")
        BMOE_RO(ChatToolCall, name) BMOE_RO(ChatToolCall, arguments) BMOE_RO(ChatToolCall, id);
    nb::class_<bmoe::ChatDelta>(m, "ChatDelta")
        BMOE_RO(ChatDelta, content) BMOE_RO(ChatDelta, reasoning) BMOE_RO(ChatDelta, tool_index)
        BMOE_RO(ChatDelta, name) BMOE_RO(ChatDelta, id) BMOE_RO(ChatDelta, arguments);
    nb::class_<bmoe::ChatParser>(m, "ChatParser")
        .def(nb::init<const bmoe::ChatPrompt &>(), nb::arg("prompt"))
        .def("update", &bmoe::ChatParser::update, nb::arg("text"), nb::arg("last") = false)
        .def_prop_ro("content", &bmoe::ChatParser::content)
        .def_prop_ro("reasoning", &bmoe::ChatParser::reasoning)
        .def_prop_ro("tool_calls", &bmoe::ChatParser::tool_calls)
        .def_prop_ro("calls_begun", &bmoe::ChatParser::calls_begun);
    // Without the GIL: common's conversion is O(n^3) in a schema's properties (seconds for a few thousand), and a
    // server's other threads (its event loop) run meanwhile.
    m.def("json_schema_grammar", &bmoe::json_schema_grammar, nb::arg("schema_json"),
          nb::call_guard<nb::gil_scoped_release>());
}
