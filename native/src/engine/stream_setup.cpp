#include "engine/stream_setup.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "bmoe/error.h"
#include "model/expert_names.h"
#include "core/telemetry.h"
#include "read/slice_layout.h"

namespace bmoe::detail {
namespace {

// The expected sum of every expert slice of every streamed tensor, from config.slice_sums. A slice
// the list does not cover means the sums were made for another file: refuse to start.
void attach_sums(std::vector<StreamedTensor> & streamed, const std::vector<SliceSum> & sums) {
    std::map<std::pair<uint32_t, uint64_t>, const SliceSum *> by_place;
    for (const SliceSum & s : sums) {
        by_place[{s.file, s.offset}] = &s;
    }
    for (StreamedTensor & t : streamed) {
        t.sums.resize(static_cast<size_t>(t.n_expert));
        for (int e = 0; e < t.n_expert; ++e) {
            const uint64_t offset = t.offset + static_cast<uint64_t>(e) * t.expert_bytes;
            const auto it = by_place.find({t.file, offset});
            if (it == by_place.end() || it->second->length != t.expert_bytes) {
                throw Error("verify_slices: the checksums do not cover " + t.name + " expert " + std::to_string(e) +
                            " (" + std::to_string(t.expert_bytes) + " bytes at offset " + std::to_string(offset) +
                            "): they were made for another model file; run bmoe-edge verify-model --rewrite");
            }
            t.sums[static_cast<size_t>(e)] = it->second->crc32c;
        }
    }
}

// The dense weights llama.cpp repacked at load live in its anonymous buffers; the file's pages it read them
// through stay mapped unless dropped, and would count twice against a memory limit.
void drop_repacked_sources(const GgufMap & gguf, const Seam & seam, const std::vector<uint8_t *> & mapping,
                           RunInfo & info) {
    for (const auto & c : seam.captured()) {
        const TensorLocation * loc = c.repacked ? gguf.find(c.name) : nullptr;
        if (loc == nullptr) {
            continue;
        }
        ++info.repacked_dense_tensors;
        info.repacked_dense_bytes += c.nbytes;
        if (mapping[loc->file] != nullptr) {
            drop_mapped_pages(mapping[loc->file] + loc->offset, loc->size);
        }
    }
}

}  // namespace

Seam::RoutedHint warm_up_reads(const GgufMap & gguf, const Recipe & recipe) {
    struct ExpertRanges {  // one expert tensor: n_expert slices of expert_bytes from offset
        int fd;
        uint64_t offset;
        uint64_t expert_bytes;
        int n_expert;
    };
    std::vector<std::vector<ExpertRanges>> by_layer;
    for (const auto & t : named_expert_tensors(gguf, recipe)) {
        const TensorLocation & loc = *t.location;
        if (loc.n_slices < 2) {
            continue;
        }
        if (static_cast<size_t>(t.layer) >= by_layer.size()) {
            by_layer.resize(static_cast<size_t>(t.layer) + 1);
        }
        by_layer[static_cast<size_t>(t.layer)].push_back(
            {gguf.file(loc.file).fd(), loc.offset, loc.size / loc.n_slices, static_cast<int>(loc.n_slices)});
    }
    return [by_layer = std::move(by_layer)](int layer, const std::vector<int> & experts) {
        if (layer < 0 || static_cast<size_t>(layer) >= by_layer.size()) {
            return;
        }
        for (const ExpertRanges & t : by_layer[static_cast<size_t>(layer)]) {
            for (int e : experts) {
                if (e >= 0 && e < t.n_expert) {
                    posix_fadvise(t.fd, static_cast<off_t>(t.offset + static_cast<uint64_t>(e) * t.expert_bytes),
                                  static_cast<off_t>(t.expert_bytes), POSIX_FADV_WILLNEED);
                }
            }
        }
    };
}

StreamingParts attach_streaming(const GgufMap & gguf, const Seam & seam, const StreamConfig & config,
                                const FaultInjection & fault, RunInfo & info) {
    StreamingParts parts;
    if (config.repack == Repack::All || config.repack == Repack::Auto) {
        parts.repacked = std::make_unique<RepackedExperts>();
    }
    uint64_t mirrored = 0;  // the pool never holds more than every mirror at once
    for (const uint64_t size : gguf.file_sizes()) {
        mirrored += (size + info.page_size - 1) / info.page_size * info.page_size;
    }
    parts.pool = std::make_unique<PagePool>(info.page_size, mirrored);

    // Every expert tensor the file has must have been seen in the graph as a MUL_MAT_ID weight.
    std::set<std::string> expected;
    for (const auto & c : seam.captured()) {
        if (c.is_expert) {
            expected.insert(c.name);
        }
    }
    std::vector<StreamedTensor> streamed;
    for (const auto & c : seam.captured()) {
        if (!c.is_expert || !c.host) {
            continue;  // an expert of a layer on an RPC worker stays there, resident
        }
        const TensorLocation * loc = gguf.find(c.name);
        uint64_t span = 0;
        if (loc == nullptr || c.n_expert <= 0 || c.expert_stride == 0 ||
            __builtin_mul_overflow(c.expert_stride, static_cast<uint64_t>(c.n_expert), &span) || loc->size < span) {
            throw Error("expert tensor " + c.name + " does not match the file's tensor table");
        }
        Seam::check_file_layout(c, gguf.file(loc->file).fd(), loc->offset);
        StreamedTensor t;
        t.layer = c.layer;
        t.projection = c.projection;
        t.file = loc->file;
        t.offset = loc->offset;
        t.expert_bytes = c.expert_stride;
        t.n_expert = c.n_expert;
        t.key = c.tensor;
        t.name = c.name;
        streamed.push_back(std::move(t));
        parts.streamed.push_back(&c);
        info.expert_bytes += c.nbytes;
        info.routed_bytes_per_token += c.expert_stride * static_cast<uint64_t>(info.n_expert_used);
    }
    if (streamed.empty()) {
        throw Error("no expert tensor was used by the graph: nothing to stream");
    }
    // Expert tensors of the file the graph did not use as expert weights stay behind llama.cpp's
    // mapping: still correct, but read on demand by page faults. Say so.
    int unstreamed = 0;
    std::string first_unstreamed;
    for (const auto & t : named_expert_tensors(gguf, seam.recipe())) {
        if (expected.count(*t.name) == 0 && t.layer < info.n_layer) {  // past the trunk: an unused MTP head
            first_unstreamed = unstreamed++ == 0 ? *t.name : first_unstreamed;
        }
    }
    if (unstreamed > 0) {
        info.warning = std::to_string(unstreamed) + " expert tensor(s) of the file are not streamed (the graph did "
                       "not use them as expert weights), e.g. " + first_unstreamed;
    }
    info.streamed_tensors = static_cast<int>(streamed.size());
    if (config.verify_slices) {
        attach_sums(streamed, config.slice_sums);
    }

    for (size_t i = 0; i < gguf.files().size(); ++i) {
        parts.mirrors.push_back(std::make_unique<Mirror>(gguf.file_sizes()[i], *parts.pool));
        parts.files.push_back(std::make_unique<SliceFile>(gguf.file(i), config.read_path, config.io_threads,
                                                          parts.mirrors.back()->base()));
    }
    info.read_path = to_string(parts.files.front()->path_used());
    for (const auto & f : parts.files) {
        if (!f->note().empty()) {
            info.read_path_note = f->note();
            info.read_path = to_string(f->path_used());
        }
        info.dio_align = std::max(info.dio_align, f->dio_align());
    }

    // Repoint: from now on the expert matmuls read the mirror; llama.cpp's mapped copy goes.
    std::vector<uint8_t *> mapping(gguf.files().size(), nullptr);  // where llama.cpp mapped each file
    for (const auto & c : seam.captured()) {
        const TensorLocation * loc = gguf.find(c.name);
        if (loc == nullptr) {
            continue;  // a graph weight that is not in the file (llama.cpp made it): leave it
        }
        const bool move_dense = !c.is_expert && config.dense == DenseMode::Anon && !c.repacked;
        if (!c.host || (!c.is_expert && !move_dense)) {
            continue;
        }
        Mirror & mirror = *parts.mirrors[loc->file];
        void * old_data = Seam::data(c);
        mapping[loc->file] = static_cast<uint8_t *>(old_data) - loc->offset;
        if (move_dense) {
            Seam::check_file_layout(c, gguf.file(loc->file).fd(), loc->offset);
            mirror.acquire(loc->offset, c.nbytes);  // permanently resident: a neighbour for eviction
            parts.files[loc->file]->read(0, loc->offset, c.nbytes);
        }
        Seam::repoint(c, mirror.base() + loc->offset);
        drop_mapped_pages(old_data, c.nbytes);  // llama.cpp's mapped copy, no longer read
    }
    drop_repacked_sources(gguf, seam, mapping, info);

    parts.lanes = std::make_unique<ReadLanes>(config.io_threads, fault);
    std::vector<SliceFile *> files;
    std::vector<Mirror *> mirrors;
    for (size_t i = 0; i < parts.files.size(); ++i) {
        files.push_back(parts.files[i].get());
        mirrors.push_back(parts.mirrors[i].get());
    }
    parts.streamer = std::make_unique<Streamer>(std::move(streamed), std::move(files), std::move(mirrors),
                                                *parts.pool, *parts.lanes, info.threads,
                                                static_cast<double>(config.io_timeout));
    return parts;
}

void repack_experts(StreamingParts & parts, RunInfo & info) {
    // Once one streamed tensor is repacked, every slice goes through a lane's buffer (read/slice_layout.h): a
    // tensor without a layout of its own is copied as the file has it.
    std::vector<std::shared_ptr<const SliceLayout>> layouts;
    bool any = false;
    uint64_t widest = Streamer::kMergeBytes;  // a prompt's batch merges adjacent slices up to this
    for (const CapturedTensor * c : parts.streamed) {
        layouts.push_back(parts.repacked->attach(*c));
        any = any || layouts.back();
        widest = std::max(widest, c->expert_stride);
    }
    info.repack_layouts = parts.repacked->layouts();
    if (!any) {
        return;  // no layout for these types here: every read lands in place, as without --repack
    }
    for (size_t i = 0; i < layouts.size(); ++i) {
        if (!layouts[i]) {
            layouts[i] = std::make_shared<FileLayout>(parts.streamed[i]->expert_stride);
        }
    }
    parts.streamer->set_layouts(std::move(layouts));
    uint64_t buffer = 0;
    for (const auto & f : parts.files) {
        buffer = std::max(buffer, f->buffer_bytes(widest));
    }
    parts.lanes->reserve_buffers(buffer);
}

}  // namespace bmoe::detail
