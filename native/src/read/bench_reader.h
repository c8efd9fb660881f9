// The engine's reader, alone: slices of one file read through the engine's own read lanes into a
// mirror backed by the page pool, O_DIRECT windows in place or pread, exactly as the streamer reads
// them, with no model loaded. `bench io` measures the drive through it (the path the engine really
// takes, not a copy of it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bmoe/config.h"

namespace bmoe::detail {

class Mirror;
class ModelFile;
class PagePool;
class ReadLanes;
class SliceFile;

struct BatchTiming {
    double seconds = 0;         // wall time of the whole batch
    uint64_t storage_bytes = 0; // what was requested from the file, alignment windows included
    std::vector<float> read_ms; // each read's own duration
};

class BenchReader {
public:
    BenchReader(const std::string & path, int lanes, ReadPath read_path, int page_kb);
    ~BenchReader();
    BenchReader(const BenchReader &) = delete;
    BenchReader & operator=(const BenchReader &) = delete;

    // Read the (offset, length) ranges as one batch over the lanes, wait, give the pages back.
    BatchTiming read(const std::vector<std::pair<uint64_t, uint64_t>> & ranges);
    ReadPath path_used() const;
    const std::string & note() const;

private:
    std::unique_ptr<ModelFile> model_file_;
    std::unique_ptr<PagePool> pool_;
    std::unique_ptr<Mirror> mirror_;
    std::unique_ptr<SliceFile> file_;
    std::unique_ptr<ReadLanes> lanes_;
};

}  // namespace bmoe::detail
