// Turning a loaded, captured model into a streamed one: check every expert tensor, reserve the
// mirrors, open the files on every lane, repoint the experts (and, for dense=anon, the dense
// weights) into the mirrors and return llama.cpp's mapped pages of them to the kernel.
#pragma once

#include <memory>
#include <vector>

#include "bmoe/config.h"
#include "bmoe/metrics.h"
#include "model/gguf_map.h"
#include "read/mirror.h"
#include "read/page_pool.h"
#include "read/read_lanes.h"
#include "seam/repacked.h"
#include "seam/seam.h"
#include "read/slice_file.h"
#include "stream/streamer.h"

namespace bmoe::detail {

// Member order is destruction order reversed: the streamer goes first, the mirrors and their page
// pool last.
struct StreamingParts {
    std::unique_ptr<RepackedExperts> repacked;  // --repack all|auto: what repacked experts name (outlives the model)
    std::unique_ptr<PagePool> pool;
    std::vector<std::unique_ptr<Mirror>> mirrors;
    std::vector<std::unique_ptr<SliceFile>> files;
    std::unique_ptr<ReadLanes> lanes;
    std::unique_ptr<Streamer> streamer;
    std::vector<const CapturedTensor *> streamed;  // the seam's capture of each of the streamer's tensors, in order
};

// The warm-up decode's hint (Seam::set_warm_up_hint): ask the kernel for each routed expert slice in
// whole reads. llama.cpp advises its expert ranges MADV_RANDOM, so without it the warm-up faults
// them in a page at a time: 86,000 requests for one token's experts on the 3 GB preset.
Seam::RoutedHint warm_up_reads(const GgufMap & gguf, const Recipe & recipe);

// The streamer starts with the cache off; the engine gives it a budget once memory is measured.
StreamingParts attach_streaming(const GgufMap & gguf, const Seam & seam, const StreamConfig & config,
                                const FaultInjection & fault, RunInfo & info);

// Hand the streamed experts to llama.cpp's repacked kernels (parts.repacked, seam/repacked.h): their slices are
// converted as they are read from now on. Before the first streamed decode (nothing is in the mirror yet).
void repack_experts(StreamingParts & parts, RunInfo & info);

}  // namespace bmoe::detail
