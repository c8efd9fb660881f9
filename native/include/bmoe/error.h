// The exception types the engine throws for expected failures (bad input, I/O errors). Their
// message is a single line meant for the user; anything else escaping the engine is a bug.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace bmoe {

// `text` as one line of valid UTF-8: control characters become spaces and bytes that are not
// UTF-8 become '?'. Strings from a model file (names, keys, tokens) go through it before they
// reach a message or Python (a hostile file must not break either).
std::string printable(const std::string & text);

class Error : public std::runtime_error {
public:
    explicit Error(const std::string & message) : std::runtime_error(printable(message)) {}
};

// An error caused only by what the caller asked for (a sampler's settings, a logit bias, a grammar, a prompt's
// tokens, a text to score): the same call with a sound request would have worked, so a server answers it with
// a 4xx and never counts it as the engine failing. A read, a decode or a changed model file stays an Error.
class RequestError : public Error {
public:
    explicit RequestError(const std::string & message) : Error(message) {}
};

// Errors llama.cpp cannot return end the process: a lost RPC worker inside a decode (ggml-rpc aborts),
// a decode past its RPC deadline. `fatal_exit` writes one line to stderr and exits 1. A program that
// embeds the engine (the server) may listen first: the listener runs once, on the failing thread (which
// then never returns to llama.cpp), and the process ends kFatalGraceSeconds later at the latest — the
// time the server has to answer its clients 503 and exit on its own.
using FatalListener = std::function<void(const std::string & line)>;
constexpr double kFatalGraceSeconds = 5.0;
void set_fatal_listener(FatalListener listener);
[[noreturn]] void fatal_exit(const std::string & line);

}  // namespace bmoe
