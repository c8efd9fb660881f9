// nanobind bindings only: every type and function here is defined in native/include/bmoe.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <type_traits>

#include "bmoe/build_info.h"
#include "bmoe/checksums.h"
#include "bmoe/config.h"
#include "bmoe/engine.h"
#include "bmoe/error.h"
#include "bmoe/metrics.h"
#include "bmoe/model_info.h"
#include "bmoe/quantize.h"
#include "bmoe/recipes.h"

namespace nb = nanobind;

void bind_parts(nb::module_ & parent);  // parts.cpp
void bind_chat(nb::module_ & m);        // chat.cpp

namespace {

#define BMOE_RO(cls, field) .def_ro(#field, &bmoe::cls::field)

// One setting as a read-write attribute: a plain value as it is, a choice as its name.
template <typename Struct, typename T>
void bind_setting(nb::class_<Struct> & cls, const char * name, T Struct::*field) {
    if constexpr (std::is_enum_v<T>) {
        cls.def_prop_rw(
            name, [field](const Struct & s) { return std::string(bmoe::to_string(s.*field)); },
            [field, name](Struct & s, const std::string & text) {
                if (!bmoe::parse_choice(text, s.*field)) {
                    std::string known;
                    for (const char * choice : bmoe::Choices<T>::names) {
                        known += (known.empty() ? "" : ", ") + std::string(choice);
                    }
                    throw bmoe::Error(std::string(name) + " must be one of " + known + ", got '" + text + "'");
                }
            });
    } else {
        cls.def_rw(name, field);
    }
}

// bmoe::set_fatal_listener for a Python callable, called with the GIL on the failing thread. The callable
// is kept for the process's life (one reference, never dropped): it may run on any thread until the
// process ends, when dropping a reference is no longer allowed.
void set_fatal_listener(nb::object listener) {
    if (listener.is_none()) {
        bmoe::set_fatal_listener(nullptr);
        return;
    }
    PyObject * fn = listener.release().ptr();
    bmoe::set_fatal_listener([fn](const std::string & line) {
#if PY_VERSION_HEX >= 0x030D0000
        const bool finalizing = Py_IsFinalizing();
#else
        const bool finalizing = _Py_IsFinalizing();
#endif
        if (!Py_IsInitialized() || finalizing) {
            return;
        }
        nb::gil_scoped_acquire gil;
        try {
            nb::handle callable(fn);
            callable(line);
        } catch (nb::python_error & e) {
            e.discard_as_unraisable("bmoe-edge fatal listener");
        }
    });
}

}  // namespace

#define BMOE_BIND_ENGINE_SETTING(type, name, ...) bind_setting(config, #name, &bmoe::StreamConfig::name);
#define BMOE_BIND_SAMPLING_SETTING(type, name, ...) bind_setting(sampling, #name, &bmoe::SamplingParams::name);
#define BMOE_BIND_TOKEN_METRIC(type, name, ...) token_metrics.def_ro(#name, &bmoe::TokenMetrics::name);
#define BMOE_BIND_RUN_INFO(type, name, ...) run_info.def_ro(#name, &bmoe::RunInfo::name);

NB_MODULE(_native, m) {
    m.doc() = "bmoe-edge native engine";

    // RequestError after EngineError: nanobind tries the last registered translator first, so a
    // bmoe::RequestError reaches Python as itself, an EngineError too (its base).
    nb::exception<bmoe::Error> engine_error(m, "EngineError");
    nb::exception<bmoe::RequestError>(m, "RequestError", engine_error);
    bind_parts(m);
    m.def("set_fatal_listener", &set_fatal_listener, nb::arg("listener").none());

    nb::class_<bmoe::BuildInfo>(m, "BuildInfo")
        .def_ro("llama_pin", &bmoe::BuildInfo::llama_pin)
        .def_ro("llama_commit", &bmoe::BuildInfo::llama_commit)
        .def_ro("expert_ready_hook", &bmoe::BuildInfo::expert_ready_hook)
        .def_ro("system_info", &bmoe::BuildInfo::system_info)
        .def_ro("rpc_protocol", &bmoe::BuildInfo::rpc_protocol)
        .def_ro("test_faults", &bmoe::BuildInfo::test_faults);
    m.def("build_info", &bmoe::build_info);

    nb::class_<bmoe::ModelInfo>(m, "ModelInfo")
        .def_ro("path", &bmoe::ModelInfo::path)
        .def_ro("architecture", &bmoe::ModelInfo::architecture)
        .def_ro("name", &bmoe::ModelInfo::name)
        .def_ro("n_layer", &bmoe::ModelInfo::n_layer)
        .def_ro("n_embd", &bmoe::ModelInfo::n_embd)
        .def_ro("n_expert", &bmoe::ModelInfo::n_expert)
        .def_ro("n_expert_used", &bmoe::ModelInfo::n_expert_used)
        .def_ro("n_tensors", &bmoe::ModelInfo::n_tensors)
        .def_ro("file_bytes", &bmoe::ModelInfo::file_bytes)
        .def_ro("n_vocab", &bmoe::ModelInfo::n_vocab)
        .def_ro("expert_bytes", &bmoe::ModelInfo::expert_bytes);
    m.def("probe_model", &bmoe::probe_model, nb::arg("path"), nb::call_guard<nb::gil_scoped_release>());

    nb::class_<bmoe::ExpertTensor>(m, "ExpertTensor")
        .def_ro("name", &bmoe::ExpertTensor::name)
        .def_ro("layer", &bmoe::ExpertTensor::layer)
        .def_ro("projection", &bmoe::ExpertTensor::projection)
        .def_ro("file", &bmoe::ExpertTensor::file)
        .def_ro("offset", &bmoe::ExpertTensor::offset)
        .def_ro("bytes", &bmoe::ExpertTensor::bytes);
    m.def("expert_tensors", &bmoe::expert_tensors, nb::arg("path"), nb::call_guard<nb::gil_scoped_release>());
    nb::class_<bmoe::MetadataEntry>(m, "MetadataEntry")
        .def_ro("key", &bmoe::MetadataEntry::key)
        .def_ro("text", &bmoe::MetadataEntry::text)
        .def_ro("number", &bmoe::MetadataEntry::number)
        .def_ro("is_number", &bmoe::MetadataEntry::is_number);
    m.def("model_metadata", &bmoe::model_metadata, nb::arg("path"), nb::call_guard<nb::gil_scoped_release>());

    m.def("file_checksums", &bmoe::file_checksums, nb::arg("path"), nb::arg("ranges"),
          nb::call_guard<nb::gil_scoped_release>());
    m.def("crc32c", [](nb::bytes b) { return bmoe::crc32c_bytes(std::string(b.c_str(), b.size())); });
    m.def("crc32c_implementation", &bmoe::crc32c_implementation);
    nb::class_<bmoe::ModelTensor>(m, "ModelTensor")
        .def_ro("name", &bmoe::ModelTensor::name)
        .def_ro("file", &bmoe::ModelTensor::file)
        .def_ro("offset", &bmoe::ModelTensor::offset)
        .def_ro("bytes", &bmoe::ModelTensor::bytes)
        .def_ro("n_slices", &bmoe::ModelTensor::n_slices);
    nb::class_<bmoe::ModelLayout>(m, "ModelLayout")
        .def_ro("files", &bmoe::ModelLayout::files)
        .def_ro("file_sizes", &bmoe::ModelLayout::file_sizes)
        .def_ro("data_starts", &bmoe::ModelLayout::data_starts)
        .def_ro("tensors", &bmoe::ModelLayout::tensors);
    m.def("model_layout", &bmoe::model_layout, nb::arg("path"), nb::call_guard<nb::gil_scoped_release>());

    m.def("quantize_model", &bmoe::quantize_model, nb::arg("input"), nb::arg("output"), nb::arg("ftype"),
          nb::arg("threads") = 0, nb::call_guard<nb::gil_scoped_release>());

    nb::class_<bmoe::Recipe>(m, "Recipe")
        .def_ro("architecture", &bmoe::Recipe::architecture)
        .def_ro("expert_suffixes", &bmoe::Recipe::expert_suffixes)
        .def_ro("note", &bmoe::Recipe::note)
        .def_ro("refused", &bmoe::Recipe::refused)
        .def_ro("draft_model", &bmoe::Recipe::draft_model);
    m.def("recipes", &bmoe::recipes);
    m.def("recipe_for", &bmoe::recipe_for);

    nb::class_<bmoe::SliceSum>(m, "SliceSum")
        .def(nb::init<>())
        .def("__init__",
             [](bmoe::SliceSum * s, uint32_t file, uint64_t offset, uint64_t length, uint32_t crc) {
                 new (s) bmoe::SliceSum{file, offset, length, crc};
             },
             nb::arg("file"), nb::arg("offset"), nb::arg("length"), nb::arg("crc32c"))
        .def_rw("file", &bmoe::SliceSum::file)
        .def_rw("offset", &bmoe::SliceSum::offset)
        .def_rw("length", &bmoe::SliceSum::length)
        .def_rw("crc32c", &bmoe::SliceSum::crc32c);

    // The settings: one attribute per row of bmoe/config.h (a choice as its name), and the rows' description.
    nb::class_<bmoe::SettingInfo>(m, "SettingInfo")
        BMOE_RO(SettingInfo, group) BMOE_RO(SettingInfo, name) BMOE_RO(SettingInfo, kind)
        BMOE_RO(SettingInfo, choices) BMOE_RO(SettingInfo, minimum) BMOE_RO(SettingInfo, maximum)
        BMOE_RO(SettingInfo, below_max) BMOE_RO(SettingInfo, auto_value)
        BMOE_RO(SettingInfo, profile) BMOE_RO(SettingInfo, lossy) BMOE_RO(SettingInfo, flag)
        BMOE_RO(SettingInfo, short_flag) BMOE_RO(SettingInfo, help);
    m.def("settings", &bmoe::settings);
    m.attr("conversation_temp") = bmoe::kConversationTemp;
    nb::class_<bmoe::StreamConfig> config(m, "StreamConfig");
    config.def(nb::init<>()).def_rw("slice_sums", &bmoe::StreamConfig::slice_sums);
    BMOE_ENGINE_SETTINGS(BMOE_BIND_ENGINE_SETTING)
    nb::class_<bmoe::SamplingParams> sampling(m, "SamplingParams");
    sampling.def(nb::init<>());
    BMOE_SAMPLING_SETTINGS(BMOE_BIND_SAMPLING_SETTING)
    m.def("check_setting", nb::overload_cast<const bmoe::StreamConfig &, const std::string &>(&bmoe::check_setting),
          nb::arg("config"), nb::arg("name"));
    m.def("check_setting", nb::overload_cast<const bmoe::SamplingParams &, const std::string &>(&bmoe::check_setting),
          nb::arg("sampling"), nb::arg("name"));
    m.def("parse_endpoints", &bmoe::parse_endpoints, nb::arg("list"));
    m.def("parse_weights", &bmoe::parse_weights, nb::arg("list"));
    m.def("compute_threads", &bmoe::compute_threads, nb::arg("threads"), nb::arg("stream"), nb::arg("cores"));

    // The telemetry records: one read-only attribute per row of bmoe/metrics.h, and the rows' description.
    nb::class_<bmoe::FieldInfo>(m, "FieldInfo")
        BMOE_RO(FieldInfo, name) BMOE_RO(FieldInfo, kind) BMOE_RO(FieldInfo, help);
    m.def("token_metrics_fields", &bmoe::token_metrics_fields);
    m.def("run_info_fields", &bmoe::run_info_fields);
    nb::class_<bmoe::TokenMetrics> token_metrics(m, "TokenMetrics");
    token_metrics.def(nb::init<>());  // the rows' defaults, for Python's record
    BMOE_TOKEN_METRICS(BMOE_BIND_TOKEN_METRIC)
    nb::class_<bmoe::RunInfo> run_info(m, "RunInfo");
    BMOE_RUN_INFO(BMOE_BIND_RUN_INFO)

    nb::class_<bmoe::TokenLogprob>(m, "TokenLogprob")
        .def_ro("token", &bmoe::TokenLogprob::token)
        .def_ro("logprob", &bmoe::TokenLogprob::logprob)
        .def_prop_ro("piece", [](const bmoe::TokenLogprob & t) { return nb::bytes(t.piece.data(), t.piece.size()); });
    nb::class_<bmoe::PositionLogprobs>(m, "PositionLogprobs")
        .def_ro("chosen", &bmoe::PositionLogprobs::chosen)
        .def_ro("top", &bmoe::PositionLogprobs::top);

    nb::class_<bmoe::StepResult>(m, "StepResult")
        .def(nb::init<>())
        .def_ro("token", &bmoe::StepResult::token)
        .def_prop_ro("piece", [](const bmoe::StepResult & r) { return nb::bytes(r.piece.data(), r.piece.size()); })
        .def_ro("end_of_generation", &bmoe::StepResult::end_of_generation)
        .def_ro("metrics", &bmoe::StepResult::metrics)
        .def_prop_ro("logits", [](const bmoe::StepResult & r) { return nb::bytes(r.logits.data(), r.logits.size()); })
        .def_ro("logprobs", &bmoe::StepResult::logprobs);

    nb::class_<bmoe::SlotStep>(m, "SlotStep")
        .def_ro("slot", &bmoe::SlotStep::slot)
        .def_ro("produced", &bmoe::SlotStep::produced)
        .def_ro("context_full", &bmoe::SlotStep::context_full)
        .def_ro("result", &bmoe::SlotStep::result);
    nb::class_<bmoe::BatchStep>(m, "BatchStep")
        .def_ro("slots", &bmoe::BatchStep::slots)
        .def_ro("metrics", &bmoe::BatchStep::metrics)
        .def_ro("n_sequences", &bmoe::BatchStep::n_sequences)
        .def_ro("n_decoding", &bmoe::BatchStep::n_decoding)
        .def_ro("summed_bytes", &bmoe::BatchStep::summed_bytes);

    m.def("overlap_in_use", &bmoe::overlap_in_use);

    bind_chat(m);

    nb::class_<bmoe::Engine>(m, "Engine")
        .def(nb::init<const std::string &, const bmoe::StreamConfig &>(), nb::arg("model_path"), nb::arg("config"),
             nb::call_guard<nb::gil_scoped_release>())
        .def_prop_ro("run_info", &bmoe::Engine::run_info, nb::rv_policy::reference_internal)
        // Without the GIL: a server's long text (MBs) takes seconds to tokenize, and its other threads run meanwhile.
        .def("tokenize", &bmoe::Engine::tokenize, nb::arg("text"), nb::arg("add_special") = true,
             nb::arg("parse_special") = true, nb::call_guard<nb::gil_scoped_release>())
        .def("detokenize", &bmoe::Engine::detokenize, nb::arg("tokens"), nb::call_guard<nb::gil_scoped_release>())
        .def("detokenize_bytes", [](const bmoe::Engine & e, const std::vector<int32_t> & tokens) {
            std::string text;  // bytes: a token may end inside a character
            {
                nb::gil_scoped_release released;
                text = e.detokenize(tokens);
            }
            return nb::bytes(text.data(), text.size());
        }, nb::arg("tokens"))
        .def("begin", &bmoe::Engine::begin, nb::arg("prompt"), nb::arg("sampling"), nb::arg("want_logits") = false,
             nb::arg("reuse_kv") = false, nb::call_guard<nb::gil_scoped_release>())
        .def("next", &bmoe::Engine::next, nb::arg("out"), nb::call_guard<nb::gil_scoped_release>())
        .def("warm_cache_memory", &bmoe::Engine::warm_cache_memory, nb::arg("max_bytes"),
             nb::call_guard<nb::gil_scoped_release>())
        .def("score", &bmoe::Engine::score, nb::arg("tokens"), nb::call_guard<nb::gil_scoped_release>())
        .def("score_positions",
             nb::overload_cast<const std::vector<int32_t> &, int>(&bmoe::Engine::score_positions),
             nb::arg("tokens"), nb::arg("n_top"), nb::call_guard<nb::gil_scoped_release>())
        .def("score_positions",
             nb::overload_cast<const std::vector<int32_t> &, int, int32_t, int32_t, bool>(
                 &bmoe::Engine::score_positions),
             nb::arg("tokens"), nb::arg("n_top"), nb::arg("first"), nb::arg("count"), nb::arg("batched"),
             nb::call_guard<nb::gil_scoped_release>())
        .def_prop_ro("score_batch", &bmoe::Engine::score_batch)
        .def_prop_ro("vocab_size", &bmoe::Engine::vocab_size)
        .def_prop_ro("chat_template", &bmoe::Engine::chat_template)
        .def_prop_ro("context_tokens", &bmoe::Engine::context_tokens)
        .def_prop_ro("n_slots", &bmoe::Engine::n_slots)
        .def("slot_begin", &bmoe::Engine::slot_begin, nb::arg("slot"), nb::arg("prompt"), nb::arg("sampling"),
             nb::arg("want_logits") = false, nb::arg("reuse_kv") = false)
        .def("slot_stop", &bmoe::Engine::slot_stop, nb::arg("slot"))
        .def("slot_clear", &bmoe::Engine::slot_clear, nb::arg("slot"))
        .def("slot_tokens", &bmoe::Engine::slot_tokens, nb::arg("slot"))
        .def("slot_active", &bmoe::Engine::slot_active, nb::arg("slot"))
        .def("step_slots", &bmoe::Engine::step_slots, nb::call_guard<nb::gil_scoped_release>())
        .def("reset", &bmoe::Engine::reset)
        .def("save_state", &bmoe::Engine::save_state, nb::arg("path"), nb::call_guard<nb::gil_scoped_release>())
        .def("load_state", &bmoe::Engine::load_state, nb::arg("path"), nb::call_guard<nb::gil_scoped_release>())
        .def("close", &bmoe::Engine::close, nb::call_guard<nb::gil_scoped_release>());
}
