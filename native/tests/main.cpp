// Runs the policy tests: the cases named as arguments, or all; `--list` prints their names.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "check.h"

int main(int argc, char ** argv) {
    using bmoe::check::cases;
    if (argc == 2 && std::strcmp(argv[1], "--list") == 0) {
        for (const auto & c : cases()) {
            std::printf("%s\n", c.name);
        }
        return 0;
    }
    int ran = 0;
    for (const auto & c : cases()) {
        bool wanted = argc == 1;
        for (int i = 1; i < argc && !wanted; ++i) {
            wanted = std::strcmp(argv[i], c.name) == 0;
        }
        if (!wanted) {
            continue;
        }
        ++ran;
        const int before = bmoe::check::failures();
        try {
            c.run();
        } catch (const std::exception & e) {
            bmoe::check::fail(c.name, 0, std::string("unexpected exception: ") + e.what());
        }
        std::printf("%s %s\n", bmoe::check::failures() == before ? "ok  " : "FAILED", c.name);
    }
    if (ran != (argc == 1 ? static_cast<int>(cases().size()) : argc - 1)) {
        std::printf("error: %d of the named cases exist\n", ran);
        return 2;
    }
    return bmoe::check::failures() == 0 ? 0 : 1;
}
