// A header-only harness for the policies' unit tests: POLICY_TEST(name) registers a case, CHECK and
// CHECK_EQ record a failure (file, line, the expression and both values) and go on, CHECK_THROWS
// wants a bmoe::Error whose message contains a needle. main.cpp runs the cases named on its command
// line (all without any), `--list` prints their names; the exit code is 1 when any check failed.
// tests/test_policies.py builds the executable and runs every case on its own.
#pragma once

#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "bmoe/error.h"

namespace bmoe::check {

struct Case {
    const char * name;
    void (*run)();
};

inline std::vector<Case> & cases() {
    static std::vector<Case> all;
    return all;
}

struct Register {
    Register(const char * name, void (*run)()) { cases().push_back({name, run}); }
};

inline int & failures() {
    static int n = 0;
    return n;
}

inline void fail(const char * file, int line, const std::string & what) {
    ++failures();
    std::printf("FAIL %s:%d: %s\n", file, line, what.c_str());
}

template <typename T>
std::string show(const T & value) {
    std::ostringstream out;
    if constexpr (std::is_same_v<T, std::string>) {
        out << '"' << value << '"';
    } else if constexpr (std::is_same_v<T, bool>) {
        out << (value ? "true" : "false");
    } else if constexpr (std::is_integral_v<T> && sizeof(T) == 1) {
        out << static_cast<int>(value);
    } else if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>) {
        if constexpr (std::is_enum_v<T>) {
            out << static_cast<int64_t>(value);
        } else {
            out << value;
        }
    } else {  // a vector
        out << '[';
        for (size_t i = 0; i < value.size(); ++i) {
            out << (i ? ", " : "") << show(value[i]);
        }
        out << ']';
    }
    return out.str();
}

}  // namespace bmoe::check

#define POLICY_TEST(name)                                                    \
    static void name();                                                      \
    static const ::bmoe::check::Register name##_registered(#name, &name); \
    static void name()

#define CHECK(cond)                                                   \
    do {                                                              \
        if (!(cond)) {                                                \
            ::bmoe::check::fail(__FILE__, __LINE__, "CHECK(" #cond ")"); \
        }                                                             \
    } while (0)

// Both sides are converted to the left side's type first, so CHECK_EQ(u64_value, 3) compares numbers.
#define CHECK_EQ(actual, expected)                                                                            \
    do {                                                                                                      \
        const auto check_actual_ = (actual);                                                                  \
        const decltype(check_actual_) check_expected_ = (expected);                                           \
        if (!(check_actual_ == check_expected_)) {                                                            \
            ::bmoe::check::fail(__FILE__, __LINE__,                                                           \
                                #actual " == " #expected ": got " + ::bmoe::check::show(check_actual_) +       \
                                    ", expected " + ::bmoe::check::show(check_expected_));                    \
        }                                                                                                     \
    } while (0)

#define CHECK_THROWS(expr, needle)                                                                         \
    do {                                                                                                   \
        bool check_threw_ = false;                                                                         \
        try {                                                                                              \
            (void)(expr);                                                                                  \
        } catch (const ::bmoe::Error & e) {                                                                \
            check_threw_ = true;                                                                           \
            if (std::string(e.what()).find(needle) == std::string::npos) {                                 \
                ::bmoe::check::fail(__FILE__, __LINE__,                                                    \
                                    #expr " threw \"" + std::string(e.what()) + "\", without \"" + (needle) + "\""); \
            }                                                                                              \
        }                                                                                                  \
        if (!check_threw_) {                                                                               \
            ::bmoe::check::fail(__FILE__, __LINE__, #expr " did not throw bmoe::Error");                   \
        }                                                                                                  \
    } while (0)
