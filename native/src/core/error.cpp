#include "bmoe/error.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <thread>

namespace bmoe {
namespace {

// The length of the valid UTF-8 sequence starting at s[i] (RFC 3629: no overlongs, no surrogates,
// at most U+10FFFF), or 0.
size_t utf8_length(const std::string & s, size_t i) {
    const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
    const uint8_t c = b(i);
    size_t n = 0;
    uint8_t low = 0x80;
    uint8_t high = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        low = c == 0xE0 ? 0xA0 : 0x80;
        high = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        low = c == 0xF0 ? 0x90 : 0x80;
        high = c == 0xF4 ? 0x8F : 0xBF;
    } else {
        return 0;
    }
    if (i + n > s.size() || b(i + 1) < low || b(i + 1) > high) {
        return 0;
    }
    for (size_t k = 2; k < n; ++k) {
        if (b(i + k) < 0x80 || b(i + k) > 0xBF) {
            return 0;
        }
    }
    return n;
}

}  // namespace

std::string printable(const std::string & text) {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        const auto c = static_cast<uint8_t>(text[i]);
        if (c < 0x80) {
            out.push_back(c < 0x20 || c == 0x7F ? ' ' : static_cast<char>(c));
            ++i;
            continue;
        }
        const size_t n = utf8_length(text, i);
        if (n == 0) {
            out.push_back('?');
            ++i;
        } else {
            out.append(text, i, n);
            i += n;
        }
    }
    return out;
}

}  // namespace bmoe

namespace bmoe {
namespace {

std::mutex g_fatal_mutex;
FatalListener g_fatal_listener;
std::atomic<bool> g_fatal_once{false};

}  // namespace

void set_fatal_listener(FatalListener listener) {
    std::lock_guard<std::mutex> lock(g_fatal_mutex);
    g_fatal_listener = std::move(listener);
}

void fatal_exit(const std::string & line) {
    std::string text = printable(line);
    if (g_fatal_once.exchange(true)) {  // a second thread failing meanwhile: the first one is ending it
        for (;;) {
            std::this_thread::sleep_for(std::chrono::seconds(1));
        }
    }
    std::fflush(stdout);
    const std::string out = text + "\n";
    (void) !write(STDERR_FILENO, out.data(), out.size());
    FatalListener listener;
    {
        std::lock_guard<std::mutex> lock(g_fatal_mutex);
        listener = g_fatal_listener;
    }
    if (listener) {
        try {
            listener(text);
        } catch (...) {  // the listener's own failure changes nothing: the process ends
        }
        std::this_thread::sleep_for(std::chrono::duration<double>(kFatalGraceSeconds));
    }
    _exit(1);
}

}  // namespace bmoe
