// Process-wide llama.cpp setup shared by every room of the engine: backend init once, and a log
// sink that keeps llama.cpp quiet but remembers its last error so our messages can quote it.
#pragma once

#include <string>

struct llama_context;

namespace bmoe::detail {

// A batch's compute threads for one scope (a long prompt's: every core), the decode's again after it.
class BatchThreads {
public:
    BatchThreads(llama_context * ctx, int decode_threads, int batch_threads);
    ~BatchThreads();
    BatchThreads(const BatchThreads &) = delete;
    BatchThreads & operator=(const BatchThreads &) = delete;

private:
    llama_context * ctx_;  // null: nothing to change
    int decode_threads_;
};

// Idempotent and thread-safe.
void ensure_llama_backend();

// The first ERROR-level line llama.cpp or ggml logged since the last clear (trimmed; the cause, where the
// later lines only say that loading failed), or "" if none. The name stays: callers read it last.
std::string last_llama_error();
void clear_llama_error();

// Everything llama.cpp and ggml log on this thread while it lives, every level: what a call said it did
// (the layout ggml's repack chose: seam/repacked.cpp). One at a time per thread.
class LogCapture {
public:
    LogCapture();
    ~LogCapture();
    LogCapture(const LogCapture &) = delete;
    LogCapture & operator=(const LogCapture &) = delete;
    const std::string & text() const { return text_; }
    void append(const char * text);  // the log sink's

private:
    std::string text_;
};

}  // namespace bmoe::detail
