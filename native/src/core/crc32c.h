// CRC-32C (Castagnoli, the iSCSI/ext4/btrfs checksum): the slice checksums of `verify-model` and
// `--verify-slices`. The standard reflected polynomial 0x82F63B78; hardware instructions where the
// CPU has them (x86 SSE4.2 detected at run time, AArch64 CRC where the build targets it), else a
// slicing-by-8 table. crc32c("123456789") == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bmoe::detail {

// `crc` is the value of the bytes before (0 to start); returns the value including these bytes.
uint32_t crc32c(const void * data, size_t length, uint32_t crc = 0);

// Which implementation this CPU gets: "sse4.2", "armv8-crc" or "table".
const char * crc32c_implementation();

}  // namespace bmoe::detail
