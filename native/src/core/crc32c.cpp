#include "core/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif
#if defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#include <arm_acle.h>
#endif

namespace bmoe::detail {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // CRC-32C, reflected

using Tables = std::array<std::array<uint32_t, 256>, 8>;

Tables make_tables() {
    Tables t{};
    for (uint32_t i = 0; i < 256; ++i) {
        uint32_t c = i;
        for (int k = 0; k < 8; ++k) {
            c = (c >> 1) ^ ((c & 1u) ? kPolynomial : 0u);
        }
        t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
        for (size_t s = 1; s < 8; ++s) {
            t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFu];
        }
    }
    return t;
}

const Tables & tables() {
    static const Tables t = make_tables();
    return t;
}

uint32_t crc_table(const uint8_t * p, size_t n, uint32_t c) {
    const Tables & t = tables();
    while (n >= 8) {
        uint64_t v;
        std::memcpy(&v, p, 8);  // little-endian hosts only (x86-64, AArch64)
        v ^= c;
        c = t[7][v & 0xFF] ^ t[6][(v >> 8) & 0xFF] ^ t[5][(v >> 16) & 0xFF] ^ t[4][(v >> 24) & 0xFF] ^
            t[3][(v >> 32) & 0xFF] ^ t[2][(v >> 40) & 0xFF] ^ t[1][(v >> 48) & 0xFF] ^ t[0][v >> 56];
        p += 8;
        n -= 8;
    }
    while (n-- > 0) {
        c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
    }
    return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc_sse42(const uint8_t * p, size_t n, uint32_t c) {
    uint64_t c64 = c;
    while (n >= 8) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        c64 = _mm_crc32_u64(c64, v);
        p += 8;
        n -= 8;
    }
    auto c32 = static_cast<uint32_t>(c64);
    while (n-- > 0) {
        c32 = _mm_crc32_u8(c32, *p++);
    }
    return c32;
}

bool have_sse42() {
    static const bool yes = __builtin_cpu_supports("sse4.2");
    return yes;
}
#endif

#if defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
uint32_t crc_arm(const uint8_t * p, size_t n, uint32_t c) {
    while (n >= 8) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        c = __crc32cd(c, v);
        p += 8;
        n -= 8;
    }
    while (n-- > 0) {
        c = __crc32cb(c, *p++);
    }
    return c;
}
#endif

}  // namespace

uint32_t crc32c(const void * data, size_t length, uint32_t crc) {
    const auto * p = static_cast<const uint8_t *>(data);
    uint32_t c = ~crc;
#if defined(__x86_64__)
    c = have_sse42() ? crc_sse42(p, length, c) : crc_table(p, length, c);
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
    c = crc_arm(p, length, c);
#else
    c = crc_table(p, length, c);
#endif
    return ~c;
}

const char * crc32c_implementation() {
#if defined(__x86_64__)
    return have_sse42() ? "sse4.2" : "table";
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
    return "armv8-crc";
#else
    return "table";
#endif
}

}  // namespace bmoe::detail
