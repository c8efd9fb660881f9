#include "model/llama_runtime.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "ggml.h"
#include "llama.h"

namespace bmoe::detail {
namespace {

std::mutex g_log_mutex;
std::string g_last_error;
std::string g_partial_line;  // llama.cpp logs some messages in pieces

bool verbose() {
    const char * v = std::getenv("BMOE_LLAMA_LOG");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
}

// What one message of llama.cpp's may print (and keep as the last error): its first kLogMessageBytes, then how
// many bytes were left out. Some messages carry what a client sent (a refused grammar's whole text, patch 0013:
// 100 KB a request), and a server's journal must not fill at a client's pace.
constexpr size_t kLogMessageBytes = 200;

std::string bounded(const char * text) {
    const size_t n = std::strlen(text);
    if (n <= kLogMessageBytes) {
        return text;
    }
    const bool line_end = text[n - 1] == '\n';
    return std::string(text, kLogMessageBytes) + "... (" + std::to_string(n - kLogMessageBytes) + " bytes more)" +
           (line_end ? "\n" : "");
}

thread_local LogCapture * t_capture = nullptr;

void log_sink(ggml_log_level level, const char * text, void *) {
    if (t_capture != nullptr) {
        t_capture->append(text);
    }
    const std::string message = bounded(text);
    if (verbose()) {
        std::fputs(message.c_str(), stderr);
    }
    std::lock_guard<std::mutex> lock(g_log_mutex);
    if (level != GGML_LOG_LEVEL_ERROR && !(level == GGML_LOG_LEVEL_CONT && !g_partial_line.empty())) {
        return;
    }
    // A message in pieces is bounded as a whole too: its start is the cause.
    if (g_partial_line.size() < kLogMessageBytes) {
        g_partial_line += message;
    } else if (!message.empty() && message.back() == '\n') {
        g_partial_line += '\n';
    }
    if (!g_partial_line.empty() && g_partial_line.back() == '\n') {
        std::string line = g_partial_line;
        while (!line.empty() && (line.back() == '\n' || line.back() == ' ')) {
            line.pop_back();
        }
        if (g_last_error.empty()) {  // the first error is the cause; llama.cpp's later ones say it failed
            g_last_error = line;
        }
        g_partial_line.clear();
    }
}

}  // namespace

void LogCapture::append(const char * text) {
    if (text_.size() < (1U << 16)) {
        text_ += text;
    }
}

LogCapture::LogCapture() { t_capture = this; }
LogCapture::~LogCapture() { t_capture = nullptr; }

void ensure_llama_backend() {
    static std::once_flag once;
    std::call_once(once, [] {
        llama_log_set(log_sink, nullptr);
        ggml_log_set(log_sink, nullptr);
        llama_backend_init();
    });
}

std::string last_llama_error() {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    return g_last_error;
}

void clear_llama_error() {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    g_last_error.clear();
    g_partial_line.clear();
}

BatchThreads::BatchThreads(llama_context * ctx, int decode_threads, int batch_threads)
    : ctx_(batch_threads != decode_threads ? ctx : nullptr), decode_threads_(decode_threads) {
    if (ctx_ != nullptr) {
        llama_set_n_threads(ctx_, decode_threads, batch_threads);
    }
}

BatchThreads::~BatchThreads() {
    if (ctx_ != nullptr) {
        llama_set_n_threads(ctx_, decode_threads_, decode_threads_);
    }
}

}  // namespace bmoe::detail
