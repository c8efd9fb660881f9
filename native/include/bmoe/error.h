// The one exception type the engine throws for expected failures (bad input, I/O errors). Its
// message is a single line meant for the user; anything else escaping the engine is a bug.
#pragma once

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

}  // namespace bmoe
