// nanobind bindings only: every type and function here is defined in native/include/bmoe.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "bmoe/build_info.h"
#include "bmoe/error.h"
#include "bmoe/model_info.h"
#include "bmoe/quantize.h"

namespace nb = nanobind;

NB_MODULE(_native, m) {
    m.doc() = "bmoe-edge native engine";

    nb::exception<bmoe::Error>(m, "EngineError");

    nb::class_<bmoe::BuildInfo>(m, "BuildInfo")
        .def_ro("llama_pin", &bmoe::BuildInfo::llama_pin)
        .def_ro("llama_commit", &bmoe::BuildInfo::llama_commit)
        .def_ro("expert_ready_hook", &bmoe::BuildInfo::expert_ready_hook)
        .def_ro("system_info", &bmoe::BuildInfo::system_info);
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
        .def_ro("n_vocab", &bmoe::ModelInfo::n_vocab);
    m.def("probe_model", &bmoe::probe_model, nb::arg("path"),
          nb::call_guard<nb::gil_scoped_release>());

    m.def("quantize_model", &bmoe::quantize_model, nb::arg("input"), nb::arg("output"), nb::arg("ftype"),
          nb::arg("threads") = 0, nb::call_guard<nb::gil_scoped_release>());
}
