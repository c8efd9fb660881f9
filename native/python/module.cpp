// nanobind bindings only: every type and function here is defined in native/include/bmoe.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bmoe/build_info.h"
#include "bmoe/chat.h"
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

NB_MODULE(_native, m) {
    m.doc() = "bmoe-edge native engine";

    nb::exception<bmoe::Error>(m, "EngineError");
    bind_parts(m);

    nb::class_<bmoe::BuildInfo>(m, "BuildInfo")
        .def_ro("llama_pin", &bmoe::BuildInfo::llama_pin)
        .def_ro("llama_commit", &bmoe::BuildInfo::llama_commit)
        .def_ro("expert_ready_hook", &bmoe::BuildInfo::expert_ready_hook)
        .def_ro("system_info", &bmoe::BuildInfo::system_info)
        .def_ro("rpc_protocol", &bmoe::BuildInfo::rpc_protocol);
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
        .def_ro("refused", &bmoe::Recipe::refused);
    m.def("recipes", &bmoe::recipes);
    m.def("recipe_for", &bmoe::recipe_for);

    nb::enum_<bmoe::ReadPath>(m, "ReadPath").value("pread", bmoe::ReadPath::Pread).value("odirect", bmoe::ReadPath::ODirect);
    nb::enum_<bmoe::DenseMode>(m, "DenseMode").value("mmap", bmoe::DenseMode::Mmap).value("anon", bmoe::DenseMode::Anon);
    nb::enum_<bmoe::Prefetch>(m, "Prefetch")
        .value("off", bmoe::Prefetch::Off)
        .value("predict", bmoe::Prefetch::Predict)
        .value("auto", bmoe::Prefetch::Auto);
    nb::enum_<bmoe::FaultKind>(m, "FaultKind")
        .value("none", bmoe::FaultKind::None)
        .value("corrupt", bmoe::FaultKind::Corrupt)
        .value("fail", bmoe::FaultKind::Fail)
        .value("short", bmoe::FaultKind::Short)
        .value("hang", bmoe::FaultKind::Hang);

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

    nb::class_<bmoe::StreamConfig>(m, "StreamConfig")
        .def(nb::init<>())
        .def_rw("stream", &bmoe::StreamConfig::stream)
        .def_rw("cache_mb", &bmoe::StreamConfig::cache_mb)
        .def_rw("cache_floor_mb", &bmoe::StreamConfig::cache_floor_mb)
        .def_rw("cache_ceil_mb", &bmoe::StreamConfig::cache_ceil_mb)
        .def_rw("cache_margin_mb", &bmoe::StreamConfig::cache_margin_mb)
        .def_rw("page_kb", &bmoe::StreamConfig::page_kb)
        .def_rw("io_threads", &bmoe::StreamConfig::io_threads)
        .def_rw("read_path", &bmoe::StreamConfig::read_path)
        .def_rw("dense", &bmoe::StreamConfig::dense)
        .def_rw("overlap", &bmoe::StreamConfig::overlap)
        .def_rw("prefetch", &bmoe::StreamConfig::prefetch)
        .def_rw("threads", &bmoe::StreamConfig::threads)
        .def_rw("ctx", &bmoe::StreamConfig::ctx)
        .def_rw("batch", &bmoe::StreamConfig::batch)
        .def_rw("ubatch", &bmoe::StreamConfig::ubatch)
        .def_rw("flash_attn", &bmoe::StreamConfig::flash_attn)
        .def_rw("route_trace", &bmoe::StreamConfig::route_trace)
        .def_rw("n_expert_used", &bmoe::StreamConfig::n_expert_used)
        .def_rw("drop_cold", &bmoe::StreamConfig::drop_cold)
        .def_rw("speculative_ngram", &bmoe::StreamConfig::speculative_ngram)
        .def_rw("draft_max", &bmoe::StreamConfig::draft_max)
        .def_rw("io_timeout_s", &bmoe::StreamConfig::io_timeout_s)
        .def_rw("verify_slices", &bmoe::StreamConfig::verify_slices)
        .def_rw("slice_sums", &bmoe::StreamConfig::slice_sums)
        .def_rw("parse_special", &bmoe::StreamConfig::parse_special)
        .def_rw("rpc_endpoints", &bmoe::StreamConfig::rpc_endpoints)
        .def_rw("rpc_split", &bmoe::StreamConfig::rpc_split)
        .def_rw("rpc_timeout_s", &bmoe::StreamConfig::rpc_timeout_s)
        .def_prop_rw(
            "fault_kind", [](const bmoe::StreamConfig & c) { return c.fault.kind; },
            [](bmoe::StreamConfig & c, bmoe::FaultKind k) { c.fault.kind = k; })
        .def_prop_rw(
            "fault_nth", [](const bmoe::StreamConfig & c) { return c.fault.nth; },
            [](bmoe::StreamConfig & c, int64_t n) { c.fault.nth = n; });

    nb::class_<bmoe::SamplingParams>(m, "SamplingParams")
        .def(nb::init<>())
        .def_rw("temp", &bmoe::SamplingParams::temp)
        .def_rw("top_k", &bmoe::SamplingParams::top_k)
        .def_rw("top_p", &bmoe::SamplingParams::top_p)
        .def_rw("min_p", &bmoe::SamplingParams::min_p)
        .def_rw("seed", &bmoe::SamplingParams::seed)
        .def_rw("grammar", &bmoe::SamplingParams::grammar);

#define BMOE_RO(cls, field) .def_ro(#field, &bmoe::cls::field)
    nb::class_<bmoe::TokenMetrics>(m, "TokenMetrics")
        BMOE_RO(TokenMetrics, step) BMOE_RO(TokenMetrics, n_tokens) BMOE_RO(TokenMetrics, wall_ms)
        BMOE_RO(TokenMetrics, io_ms) BMOE_RO(TokenMetrics, stall_ms) BMOE_RO(TokenMetrics, drain_ms) BMOE_RO(TokenMetrics, compute_ms)
        BMOE_RO(TokenMetrics, bytes_read) BMOE_RO(TokenMetrics, slice_bytes) BMOE_RO(TokenMetrics, copy_bytes)
        BMOE_RO(TokenMetrics, cache_lookups) BMOE_RO(TokenMetrics, cache_hits) BMOE_RO(TokenMetrics, evictions) BMOE_RO(TokenMetrics, rereads)
        BMOE_RO(TokenMetrics, major_faults) BMOE_RO(TokenMetrics, rss_bytes)
        BMOE_RO(TokenMetrics, resident_expert_bytes) BMOE_RO(TokenMetrics, cache_budget_bytes)
        BMOE_RO(TokenMetrics, pool_bytes) BMOE_RO(TokenMetrics, drafted) BMOE_RO(TokenMetrics, accepted)
        BMOE_RO(TokenMetrics, dropped) BMOE_RO(TokenMetrics, read_ahead) BMOE_RO(TokenMetrics, predicted) BMOE_RO(TokenMetrics, predicted_correct)
        BMOE_RO(TokenMetrics, ahead_bytes) BMOE_RO(TokenMetrics, ahead_wasted_bytes)
        BMOE_RO(TokenMetrics, net_bytes);

    nb::class_<bmoe::RunInfo>(m, "RunInfo")
        BMOE_RO(RunInfo, model) BMOE_RO(RunInfo, architecture) BMOE_RO(RunInfo, n_layer) BMOE_RO(RunInfo, n_expert)
        BMOE_RO(RunInfo, n_expert_used) BMOE_RO(RunInfo, streaming) BMOE_RO(RunInfo, streamed_tensors)
        BMOE_RO(RunInfo, expert_bytes) BMOE_RO(RunInfo, file_bytes) BMOE_RO(RunInfo, n_files)
        BMOE_RO(RunInfo, threads) BMOE_RO(RunInfo, io_threads) BMOE_RO(RunInfo, read_path_requested)
        BMOE_RO(RunInfo, read_path) BMOE_RO(RunInfo, read_path_note) BMOE_RO(RunInfo, dio_align)
        BMOE_RO(RunInfo, page_size) BMOE_RO(RunInfo, kernel_page_size) BMOE_RO(RunInfo, cache_budget_mb)
        BMOE_RO(RunInfo, cache_mode) BMOE_RO(RunInfo, cache_note) BMOE_RO(RunInfo, memory_limit_source)
        BMOE_RO(RunInfo, memory_limit_mb) BMOE_RO(RunInfo, memory_headroom_mb) BMOE_RO(RunInfo, memory_pending_mb)
        BMOE_RO(RunInfo, cache_adaptive)
        BMOE_RO(RunInfo, dense) BMOE_RO(RunInfo, overlap) BMOE_RO(RunInfo, prefetch) BMOE_RO(RunInfo, prefetch_note) BMOE_RO(RunInfo, hook_compiled_in)
        BMOE_RO(RunInfo, lazy_load) BMOE_RO(RunInfo, ctx) BMOE_RO(RunInfo, batch) BMOE_RO(RunInfo, ubatch)
        BMOE_RO(RunInfo, flash_attn) BMOE_RO(RunInfo, fault) BMOE_RO(RunInfo, io_timeout_s)
        BMOE_RO(RunInfo, verify_slices) BMOE_RO(RunInfo, parse_special) BMOE_RO(RunInfo, warning) BMOE_RO(RunInfo, load_ms)
        BMOE_RO(RunInfo, load_bytes_read) BMOE_RO(RunInfo, load_major_faults) BMOE_RO(RunInfo, rss_after_load)
        BMOE_RO(RunInfo, routed_bytes_per_token) BMOE_RO(RunInfo, speculative) BMOE_RO(RunInfo, lossy)
        BMOE_RO(RunInfo, placement) BMOE_RO(RunInfo, rpc_workers) BMOE_RO(RunInfo, main_layers);
#undef BMOE_RO

    nb::class_<bmoe::StepResult>(m, "StepResult")
        .def(nb::init<>())
        .def_ro("token", &bmoe::StepResult::token)
        .def_prop_ro("piece", [](const bmoe::StepResult & r) { return nb::bytes(r.piece.data(), r.piece.size()); })
        .def_ro("end_of_generation", &bmoe::StepResult::end_of_generation)
        .def_ro("metrics", &bmoe::StepResult::metrics)
        .def_prop_ro("logits", [](const bmoe::StepResult & r) { return nb::bytes(r.logits.data(), r.logits.size()); });

    m.def("overlap_in_use", &bmoe::overlap_in_use);

    nb::class_<bmoe::ChatMessage>(m, "ChatMessage")
        .def(nb::init<>())
        .def("__init__", [](bmoe::ChatMessage * self, std::string role, std::string content) {
            new (self) bmoe::ChatMessage{std::move(role), std::move(content)};
        }, nb::arg("role"), nb::arg("content"))
        .def_rw("role", &bmoe::ChatMessage::role)
        .def_rw("content", &bmoe::ChatMessage::content);
    m.def("apply_chat_template", &bmoe::apply_chat_template, nb::arg("template"), nb::arg("messages"),
          nb::arg("add_assistant"));
    m.def("builtin_chat_templates", &bmoe::builtin_chat_templates);

    nb::class_<bmoe::Engine>(m, "Engine")
        .def(nb::init<const std::string &, const bmoe::StreamConfig &>(), nb::arg("model_path"), nb::arg("config"),
             nb::call_guard<nb::gil_scoped_release>())
        .def_prop_ro("run_info", &bmoe::Engine::run_info, nb::rv_policy::reference_internal)
        .def("tokenize", &bmoe::Engine::tokenize, nb::arg("text"), nb::arg("add_special") = true,
             nb::arg("parse_special") = true)
        .def("detokenize", &bmoe::Engine::detokenize, nb::arg("tokens"))
        .def("begin", &bmoe::Engine::begin, nb::arg("prompt"), nb::arg("sampling"), nb::arg("want_logits") = false,
             nb::arg("reuse_kv") = false, nb::call_guard<nb::gil_scoped_release>())
        .def("next", &bmoe::Engine::next, nb::arg("out"), nb::call_guard<nb::gil_scoped_release>())
        .def("score", &bmoe::Engine::score, nb::arg("tokens"), nb::call_guard<nb::gil_scoped_release>())
        .def_prop_ro("chat_template", &bmoe::Engine::chat_template)
        .def_prop_ro("context_tokens", &bmoe::Engine::context_tokens)
        .def("reset", &bmoe::Engine::reset)
        .def("save_state", &bmoe::Engine::save_state, nb::arg("path"), nb::call_guard<nb::gil_scoped_release>())
        .def("load_state", &bmoe::Engine::load_state, nb::arg("path"), nb::call_guard<nb::gil_scoped_release>())
        .def("close", &bmoe::Engine::close, nb::call_guard<nb::gil_scoped_release>());
}
