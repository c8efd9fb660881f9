// The settings rows (bmoe/config.h) expanded: their description for the bindings, and their checks.
#include "bmoe/config.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "bmoe/error.h"

namespace bmoe {
namespace {

template <typename T>
constexpr bool is_number = std::is_arithmetic_v<T> && !std::is_same_v<T, bool>;

std::string number_text(double v) {
    char text[48];
    std::snprintf(text, sizeof(text), "%.15g", v);
    return text;
}

template <typename T>
std::string kind_of() {
    if constexpr (std::is_same_v<T, bool>) {
        return "bool";
    } else if constexpr (std::is_integral_v<T>) {
        return "int";
    } else if constexpr (std::is_floating_point_v<T>) {
        return "float";
    } else if constexpr (std::is_same_v<T, std::string>) {
        return "str";
    } else if constexpr (std::is_same_v<T, Toggle>) {
        return "toggle";
    } else {
        return "choice";
    }
}

template <typename T>
std::vector<std::string> choices_of() {
    if constexpr (std::is_enum_v<T>) {
        return {std::begin(Choices<T>::names), std::end(Choices<T>::names)};
    } else {
        return {};
    }
}

const char * profile_text(Profile p) {
    return p == Profile::Required ? "required" : p == Profile::Optional ? "optional" : "";
}

std::string long_flag(const std::string & name, bool toggle) {
    std::string flag = "--" + name;
    for (char & c : flag) {
        c = c == '_' ? '-' : c;
    }
    return toggle ? flag + "/--no-" + flag.substr(2) : flag;
}

template <typename T>
SettingInfo describe_row(const char * group, const char * name, double lo, double hi, Rule rule, Profile profile,
                         Output output, const char * flag, const char * help) {
    SettingInfo s;
    s.group = group;
    s.name = name;
    s.kind = kind_of<T>();
    s.choices = choices_of<T>();
    if constexpr (is_number<T>) {
        s.minimum = lo;
        s.maximum = hi;
    }
    s.below_max = rule == Rule::BelowMax;
    s.auto_value = rule == Rule::Auto || std::is_same_v<T, Toggle>;
    s.profile = profile_text(profile);
    s.lossy = output == Output::Lossy;
    if (flag != nullptr) {
        s.flag = long_flag(name, std::is_same_v<T, bool> || std::is_same_v<T, Toggle>);
        s.short_flag = flag;
    }
    s.help = std::string(s.lossy ? "LOSSY: " : "") + help;
    return s;
}

void check_page_unit(const char * name, double kb) {
    const long kernel_kb = sysconf(_SC_PAGESIZE) / 1024;
    const auto unit = static_cast<long>(kb);
    if (unit != 0 && (unit < kernel_kb || (unit & (unit - 1)) != 0)) {
        throw Error(std::string(name) + " must be 0 (the kernel's page) or a power of two from this kernel's page "
                    "size (" + std::to_string(kernel_kb) + " KiB) to 1024 KiB, got " + number_text(kb));
    }
}

// One row's bounds and rule.
template <typename T>
void check_row(const char * name, const T & value, double lo, double hi, Rule rule) {
    if constexpr (is_number<T>) {
        const auto v = static_cast<double>(value);
        if (rule == Rule::Auto && v == kAuto) {
            return;
        }
        const bool above = rule == Rule::BelowMax ? !(v < hi) : v > hi;
        if (std::isnan(v) || v < lo || above) {
            const std::string range = hi == kNoLimit ? ">= " + number_text(lo)
                                      : rule == Rule::BelowMax
                                          ? "in [" + number_text(lo) + ", " + number_text(hi) + ")"
                                          : "between " + number_text(lo) + " and " + number_text(hi);
            throw Error(std::string(name) + " must be " + range + (rule == Rule::Auto ? " or auto" : "") + ", got " +
                        number_text(v));
        }
        if (rule == Rule::PageUnit) {
            check_page_unit(name, v);
        }
    } else if constexpr (std::is_same_v<T, std::string>) {
        if (rule == Rule::FaultSpec) {
            parse_fault(value, name);
        } else if (rule == Rule::Endpoints && !value.empty()) {
            parse_endpoints(value);
        } else if (rule == Rule::Weights && !value.empty()) {
            parse_weights(value);
        } else if (rule == Rule::LogitBias && !value.empty()) {
            parse_logit_bias(value);
        }
    } else if constexpr (std::is_enum_v<T>) {
        const auto i = static_cast<size_t>(value);
        if (i >= std::size(Choices<T>::names)) {
            throw Error(std::string(name) + ": not one of its choices");
        }
    }
}

#define BMOE_DESCRIBE(group, type, name, default_value, lo, hi, rule, profile, output, flag, help) \
    out.push_back(describe_row<type>(group, #name, lo, hi, rule, profile, output, flag, help));
#define BMOE_DESCRIBE_ENGINE(...) BMOE_DESCRIBE("engine", __VA_ARGS__)
#define BMOE_DESCRIBE_SAMPLING(...) BMOE_DESCRIBE("sampling", __VA_ARGS__)
#define BMOE_CHECK_NAMED(type, name, default_value, lo, hi, rule, ...) \
    if (wanted == #name) {                                              \
        check_row<type>(#name, c.name, lo, hi, rule);                   \
        return;                                                         \
    }
#define BMOE_CHECK_ALL(type, name, default_value, lo, hi, rule, ...) check_row<type>(#name, c.name, lo, hi, rule);

// A value as the run info's `lossy` label shows it.
template <typename T>
std::string label_text(const T & value) {
    if constexpr (std::is_same_v<T, bool>) {
        return value ? "true" : "false";
    } else if constexpr (std::is_floating_point_v<T>) {
        char text[48];
        std::snprintf(text, sizeof(text), "%g", static_cast<double>(value));
        return text;
    } else if constexpr (std::is_integral_v<T>) {
        return std::to_string(value);
    } else if constexpr (std::is_enum_v<T>) {
        return to_string(value);
    } else {
        return value;
    }
}
#define BMOE_LOSSY_LABEL(type, name, default_value, lo, hi, rule, profile, output, ...)        \
    if (output == Output::Lossy && !(c.name == static_cast<type>(default_value))) {           \
        label += (label.empty() ? "" : ", ") + std::string(#name "=") + label_text(c.name);  \
    }

}  // namespace

std::vector<SettingInfo> settings() {
    std::vector<SettingInfo> out;
    BMOE_ENGINE_SETTINGS(BMOE_DESCRIBE_ENGINE)
    BMOE_SAMPLING_SETTINGS(BMOE_DESCRIBE_SAMPLING)
    return out;
}

void check_setting(const StreamConfig & c, const std::string & wanted) {
    BMOE_ENGINE_SETTINGS(BMOE_CHECK_NAMED)
    throw Error("unknown engine setting '" + wanted + "'");
}

void check_setting(const SamplingParams & c, const std::string & wanted) {
    BMOE_SAMPLING_SETTINGS(BMOE_CHECK_NAMED)
    throw Error("unknown sampling setting '" + wanted + "'");
}

void check_settings(const StreamConfig & c) { BMOE_ENGINE_SETTINGS(BMOE_CHECK_ALL) }

void check_settings(const SamplingParams & c) { BMOE_SAMPLING_SETTINGS(BMOE_CHECK_ALL) }

std::string lossy_settings(const StreamConfig & c) {
    std::string label;
    BMOE_ENGINE_SETTINGS(BMOE_LOSSY_LABEL)
    return label;
}

// 0 = auto: every core for a resident run; one core left to the read lanes while streaming. llama.cpp's
// compute threads spin at their barriers, so a thread per core starves the lanes (and itself, waiting for a
// descheduled peer): on 2 cores, streaming with 2 compute threads decoded 0.4 tok/s against 1.0-1.7 with 1
// (bench-data/2026-11-30). `tune` compares its measurements with this rule (through the bindings).
int compute_threads(int threads, bool stream, int cores) {
    return threads > 0 ? threads : stream ? std::max(1, cores - 1) : cores;
}

FaultInjection parse_fault(const std::string & spec, const std::string & what) {
    FaultInjection f;
    if (spec.empty()) {
        return f;
    }
    const size_t colon = spec.find(':');
    std::string nth = colon == std::string::npos ? "" : spec.substr(colon + 1);
    if (!nth.empty() && nth.back() == '+') {
        f.onward = true;
        nth.pop_back();
    }
    const bool digits = !nth.empty() && nth.size() < 18 && nth.find_first_not_of("0123456789") == std::string::npos;
    if (!parse_choice(spec.substr(0, colon), f.kind) || f.kind == FaultKind::None || !digits ||
        (f.nth = std::atoll(nth.c_str())) < 1) {
        throw Error(what + " must be corrupt:N, fail:N, short:N or hang:N with N >= 1 (N+: from the Nth read on), got '" +
                    spec + "'");
    }
    return f;
}

std::string describe(const FaultInjection & f) {
    return f.kind == FaultKind::None ? ""
                                     : std::string(to_string(f.kind)) + ":" + std::to_string(f.nth) + (f.onward ? "+" : "");
}

std::vector<std::string> parse_endpoints(const std::string & list) {
    std::vector<std::string> out;
    size_t start = 0;
    while (true) {
        const size_t comma = list.find(',', start);
        std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        item.erase(0, item.find_first_not_of(' '));
        item.erase(item.find_last_not_of(' ') + 1);
        const size_t colon = item.rfind(':');
        const std::string port = colon == std::string::npos ? "" : item.substr(colon + 1);
        const bool digits = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
        if (colon == 0 || colon == std::string::npos || !digits || std::atoi(port.c_str()) < 1 ||
            std::atoi(port.c_str()) > 65535) {
            throw Error("rpc: '" + item + "' is not HOST:PORT (e.g. 127.0.0.1:50052)");
        }
        for (const auto & seen : out) {
            if (seen == item) {
                throw Error("rpc: worker " + item + " is listed twice");
            }
        }
        out.push_back(item);
        if (comma == std::string::npos) {
            return out;
        }
        start = comma + 1;
    }
}

std::vector<double> parse_weights(const std::string & list) {
    std::vector<double> out;
    double sum = 0;
    size_t start = 0;
    while (true) {
        const size_t comma = list.find(',', start);
        const std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        char * end = nullptr;
        const double w = std::strtod(item.c_str(), &end);
        if (item.empty() || end == item.c_str() || *end != '\0' || !(w >= 0) || std::isinf(w)) {
            throw Error("rpc_split must be weights >= 0 separated by commas, got '" + list + "'");
        }
        out.push_back(w);
        sum += w;
        if (comma == std::string::npos) {
            break;
        }
        start = comma + 1;
    }
    if (sum <= 0) {
        throw Error("rpc_split weights must not all be 0, got '" + list + "'");
    }
    return out;
}

std::vector<std::pair<int32_t, float>> parse_logit_bias(const std::string & list) {
    std::vector<std::pair<int32_t, float>> out;
    if (list.empty()) {
        return out;
    }
    size_t start = 0;
    while (true) {
        const size_t comma = list.find(',', start);
        const std::string item = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        const size_t colon = item.find(':');
        const std::string id = colon == std::string::npos ? "" : item.substr(0, colon);
        const std::string bias = colon == std::string::npos ? "" : item.substr(colon + 1);
        char * end = nullptr;
        const double b = std::strtod(bias.c_str(), &end);
        const bool digits = !id.empty() && id.size() <= 9 && id.find_first_not_of("0123456789") == std::string::npos;
        if (!digits || bias.empty() || end == bias.c_str() || *end != '\0' || !(b >= -100 && b <= 100)) {
            throw Error("logit_bias must be ID:BIAS[,ID:BIAS...] with token ids >= 0 and biases from -100 to 100, "
                        "got '" + item.substr(0, 64) + "'");
        }
        out.emplace_back(static_cast<int32_t>(std::atol(id.c_str())), static_cast<float>(b));
        if (comma == std::string::npos) {
            return out;
        }
        start = comma + 1;
    }
}

}  // namespace bmoe
