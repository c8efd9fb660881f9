// The one exception type the engine throws for expected failures (bad input, I/O errors). Its
// message is a single line meant for the user; anything else escaping the engine is a bug.
#pragma once

#include <stdexcept>
#include <string>

namespace bmoe {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string & message) : std::runtime_error(message) {}
};

}  // namespace bmoe
