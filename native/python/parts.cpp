// Bindings of the engine's rooms, one by one: the expert cache (bench replays a routing trace through
// the engine's own policy), the reader (bench io measures the engine's own read path), the mirror
// with its page pool and expert-name parsing (unit tests). Not the engine's API: that is module.cpp.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <optional>

#include "read/bench_reader.h"
#include "bmoe/error.h"
#include "policy/expert_cache.h"
#include "model/expert_names.h"
#include "read/mirror.h"
#include "read/page_pool.h"

namespace nb = nanobind;
using namespace bmoe::detail;

namespace {

// A mirror and the pool behind it, as the engine pairs them.
struct MirrorWithPool {
    MirrorWithPool(uint64_t file_size, uint64_t unit) : pool(unit, file_size), mirror(file_size, pool) {}
    PagePool pool;
    Mirror mirror;
};

}  // namespace

void bind_parts(nb::module_ & parent) {
    nb::module_ m = parent.def_submodule("parts", "the engine's rooms, bound for bench and unit tests");

    nb::class_<ExpertCache>(m, "ExpertCache")
        .def("__init__",
             [](ExpertCache * c, uint64_t budget, std::vector<uint64_t> bytes, std::vector<int> n, const std::string & ranking) {
                 if (ranking != "frequency" && ranking != "lru") {
                     throw bmoe::Error("ranking is frequency or lru, not " + ranking);
                 }
                 new (c) ExpertCache(budget, std::move(bytes), std::move(n),
                                     ranking == "lru" ? Ranking::Lru : Ranking::Frequency);
             },
             nb::arg("budget_bytes"), nb::arg("expert_bytes"), nb::arg("n_expert"), nb::arg("ranking") = "frequency")
        .def("visit", &ExpertCache::visit)
        .def("touch", [](ExpertCache & c, int layer, int expert, int uses) { return c.touch({layer, expert}, uses); },
             nb::arg("layer"), nb::arg("expert"), nb::arg("uses") = 1)
        .def("insert", [](ExpertCache & c, int layer, int expert) { c.insert({layer, expert}); })
        .def("evict_over_budget",
             [](ExpertCache & c, int pinned) {
                 std::vector<std::pair<int, int>> out;
                 for (const ExpertKey & k : c.evict_over_budget(pinned)) {
                     out.emplace_back(k.layer, k.expert);
                 }
                 return out;
             })
        .def("evict_layer", &ExpertCache::evict_layer)
        .def("set_budget", &ExpertCache::set_budget)
        .def_prop_ro("per_layer", &ExpertCache::per_layer)
        .def("share", &ExpertCache::share)
        .def_prop_ro("resident_bytes", &ExpertCache::resident_bytes)
        .def("__len__", &ExpertCache::size);

    nb::class_<MirrorWithPool>(m, "Mirror")
        .def(nb::init<uint64_t, uint64_t>(), nb::arg("file_size"), nb::arg("unit"))
        .def("acquire", [](MirrorWithPool & w, uint64_t off, uint64_t len) { w.mirror.acquire(off, len); })
        .def("release", [](MirrorWithPool & w, uint64_t off, uint64_t len) { w.mirror.release(off, len); })
        .def("references", [](MirrorWithPool & w, uint64_t off) { return w.mirror.references(off); })
        .def_prop_ro("resident_bytes", [](MirrorWithPool & w) { return w.mirror.resident_bytes(); })
        .def_prop_ro("base_address", [](MirrorWithPool & w) { return reinterpret_cast<uintptr_t>(w.mirror.base()); })
        .def("write",
             [](MirrorWithPool & w, uint64_t off, nb::bytes data) {
                 std::memcpy(w.mirror.base() + off, data.c_str(), data.size());
             })
        .def("read",
             [](MirrorWithPool & w, uint64_t off, uint64_t n) {
                 return nb::bytes(reinterpret_cast<const char *>(w.mirror.base() + off), n);
             })
        .def_prop_ro("pool_units_in_use", [](MirrorWithPool & w) { return w.pool.units_in_use(); })
        .def_prop_ro("pool_size_units", [](MirrorWithPool & w) { return w.pool.size_units(); })
        .def_prop_ro("pool_held_units", [](MirrorWithPool & w) { return w.pool.held_units(); })
        .def("set_huge_pages", [](MirrorWithPool & w, bool on) { w.pool.set_huge_pages(on); })
        .def("trim", [](MirrorWithPool & w, uint64_t keep_units) { return w.pool.trim(keep_units); },
             nb::arg("keep_units") = 0)
        .def("reserve", [](MirrorWithPool & w, uint64_t target, uint64_t step) { return w.pool.reserve(target, step); },
             nb::arg("target_units"), nb::arg("step_units"));

    nb::class_<BenchReader>(m, "Reader")
        .def("__init__",
             [](BenchReader * r, const std::string & path, int lanes, const std::string & read_path, int page_kb) {
                 bmoe::ReadPath mode{};
                 if (!bmoe::parse_choice(read_path, mode)) {
                     throw bmoe::Error("read_path must be pread or odirect, got '" + read_path + "'");
                 }
                 nb::gil_scoped_release release;
                 new (r) BenchReader(path, lanes, mode, page_kb);
             },
             nb::arg("path"), nb::arg("lanes"), nb::arg("read_path"), nb::arg("page_kb") = 0)
        .def(
            "read",
            [](BenchReader & r, const std::vector<std::pair<uint64_t, uint64_t>> & ranges) {
                BatchTiming t;
                {
                    nb::gil_scoped_release release;
                    t = r.read(ranges);
                }
                nb::dict out;
                out["seconds"] = t.seconds;
                out["storage_bytes"] = t.storage_bytes;
                out["read_ms"] = t.read_ms;
                return out;
            },
            nb::arg("ranges"))
        .def_prop_ro("read_path", [](const BenchReader & r) { return std::string(bmoe::to_string(r.path_used())); })
        .def_prop_ro("note", &BenchReader::note);

    m.def("parse_expert_name", [](const std::string & name, std::vector<std::string> suffixes) {
        bmoe::Recipe recipe;
        recipe.expert_suffixes = std::move(suffixes);
        int layer = 0;
        int projection = 0;
        return parse_expert_name(name, recipe, layer, projection) ? std::optional<std::pair<int, int>>({layer, projection})
                                                                  : std::nullopt;
    });
}
