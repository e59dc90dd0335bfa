// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the store's challenge-response
// handshake (runtime/store_protocol.h), and the random bytes its secrets and nonces come from.
// Written here rather than linked from OpenSSL so that the installed library and the Python
// wheel carry no crypto dependency; tests/runtime/hmac_test.cpp checks both against the
// published vectors (FIPS 180-4 examples, RFC 4231).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace asynctp {

using Digest = std::array<uint8_t, 32>;

Digest sha256(std::string_view data);
Digest hmac_sha256(std::string_view key, std::string_view message);

// Whether a and b are equal, in a time that depends on their lengths only (never on where they
// first differ), so that a client cannot find a valid MAC byte by byte.
bool constant_time_equal(std::string_view a, std::string_view b);

// `n` bytes from the kernel's random source (getrandom(2)); throws Error when it fails.
std::string random_bytes(size_t n);
// 2 * n lower-case hex digits of random_bytes(n).
std::string random_hex_secret(size_t n);

std::string to_hex(std::string_view bytes);
inline std::string_view as_bytes(const Digest& d) {
  return {reinterpret_cast<const char*>(d.data()), d.size()};
}

}  // namespace asynctp
