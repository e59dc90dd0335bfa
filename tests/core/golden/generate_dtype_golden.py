#!/usr/bin/env python3
"""Generates tests/core/dtype_golden_data.h: PyTorch's own dtype conversions, as tables.

Needs torch (any build; the CPU casts are what is recorded) and is NOT run by CI: the test
(dtype_golden_test.cpp) only reads the generated header. Regenerate with

    python3 tests/core/golden/generate_dtype_golden.py > tests/core/dtype_golden_data.h
    clang-format -i tests/core/dtype_golden_data.h

What it records:
  * every float8_e4m3fn and float8_e5m2 bit pattern decoded to float32 (tensor.float());
  * FNV-1a hashes of every float16 and bfloat16 bit pattern decoded to float32;
  * a few thousand float32 values (the special values, every rounding boundary of both f8
    formats and the edges of f16 and bf16, plus random ones) encoded with tensor.to(dtype) for
    bfloat16, float16, float8_e4m3fn and float8_e5m2, and the saturating f8 casts as training
    recipes write them: x.clamp(-max, max).to(dtype) (clamp keeps NaN).
"""
import math
import random
import struct
import sys

import torch

F32_MAX = struct.unpack("<f", struct.pack("<I", 0x7F7FFFFF))[0]


def f32(bits):
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def bits_of(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def next_up(x):
    return math.nextafter(x, math.inf)


def next_down(x):
    return math.nextafter(x, -math.inf)


def to_f32(x):
    """Rounds a Python float to the nearest float32 (as a float)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_neighbours(x):
    """x and the float32 values just below and above it."""
    x = to_f32(x)
    b = bits_of(x)
    return [x, f32(b - 1) if b & 0x7FFFFFFF else x, f32(b + 1)]


def decode_all(dtype, width):
    n = 1 << width
    int_type = {8: torch.uint8, 16: torch.int16}[width]
    raw = torch.arange(n, dtype=torch.int64).to(int_type)  # wraps to the signed 16-bit range
    return raw.view(dtype).float().view(torch.int32).tolist()


def fnv1a(words):
    h = 0xCBF29CE484222325
    for w in words:
        for byte in (w & 0xFFFFFFFF).to_bytes(4, "little"):
            h ^= byte
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def boundary_inputs(values, overflow_value):
    """Every representable value, the midpoints between neighbours and the floats around them."""
    pos = sorted(v for v in values if v >= 0 and math.isfinite(v)) + [overflow_value]
    out = []
    for a, b in zip(pos, pos[1:]):
        out += f32_neighbours(a)
        out += f32_neighbours((a + b) / 2)
    out += f32_neighbours(overflow_value) + [overflow_value * 1.5, overflow_value * 4]
    return out


def main():
    inputs = []
    # Special values: zeros, infinities, NaNs with both signs and several payloads, f32 limits.
    special_bits = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
                    0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FA00000, 0x7FC00001,
                    0x7FBFFFFF, 0x7FF00000, 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF,
                    0x00800000, 0x80800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0xBF800000]
    inputs += [f32(b) for b in special_bits]

    # f8 formats: every rounding boundary (e4m3: 480 would be the next value, past it NaN;
    # e5m2: 65536 would be the next value, i.e. inf).
    e4m3_values = [f32(b) for b in decode_all(torch.float8_e4m3fn, 8)]
    e5m2_values = [f32(b) for b in decode_all(torch.float8_e5m2, 8)]
    inputs += boundary_inputs(e4m3_values, 480.0)
    inputs += boundary_inputs(e5m2_values, 65536.0)
    inputs += [464.0001, 61439.0, 65519.99, 65520.0]

    # f16: subnormals (first and last few, and the step to the smallest normal), each binade's
    # first and last steps, and the overflow threshold.
    s = 2.0**-24
    for m in list(range(0, 9)) + list(range(1018, 1026)):
        inputs += f32_neighbours(m * s) + f32_neighbours((m + 0.5) * s)
    for e in range(-14, 16):
        ulp = 2.0 ** (e - 10)
        for base in (2.0**e, 2.0 ** (e + 1) - ulp):
            inputs += f32_neighbours(base + ulp / 2) + f32_neighbours(base - ulp / 2)
    inputs += f32_neighbours(65504.0) + f32_neighbours(65520.0) + f32_neighbours(65536.0)

    # bf16: ties in several binades, subnormals, and the overflow threshold.
    for e in (-133, -127, -126, -100, -1, 0, 1, 7, 50, 127):
        for m in (0, 1, 2, 3, 0x7E, 0x7F):
            base = (1.0 + m / 128) * 2.0**e if e >= -126 else m * 2.0**-133
            half = (2.0 ** (e - 8)) if e >= -126 else 2.0**-134
            if math.isfinite(base + half) and base + half < F32_MAX:
                inputs += f32_neighbours(base + half)
    inputs += [f32(0x7F7F7FFF), f32(0x7F7F8000), f32(0x00008000), f32(0x00018000)]

    # Random: uniform bit patterns (NaNs, infinities and subnormals included), then values
    # spread over the magnitudes the narrow formats hold.
    rng = random.Random(20240611)
    inputs += [f32(rng.getrandbits(32)) for _ in range(300)]
    for _ in range(600):
        inputs.append(to_f32(rng.gauss(0, 1) * 2.0 ** rng.uniform(-26, 18)))

    # Both signs of everything; then unique by bit pattern, in a stable order.
    seen, cases = set(), []
    for x in inputs + [-x for x in inputs]:
        b = bits_of(to_f32(x)) if not math.isnan(x) else bits_of(x)
        if b not in seen:
            seen.add(b)
            cases.append(b)

    src = torch.tensor(cases, dtype=torch.int64)
    src = torch.where(src >= 1 << 31, src - (1 << 32), src).to(torch.int32).view(torch.float32)

    def encode(dtype, clamp=None):
        x = src if clamp is None else src.clamp(-clamp, clamp)
        out = x.to(dtype)
        width = {1: torch.uint8, 2: torch.int16}[out.element_size()]
        mask = (1 << (8 * out.element_size())) - 1
        whole = [v & mask for v in out.view(width).tolist()]
        # The same cast one element at a time (torch's scalar tail path); report disagreements.
        for i in range(0, len(cases), 97):
            single = x[i : i + 1].to(dtype).view(width).tolist()[0] & mask
            if single != whole[i]:
                print(f"warning: {dtype} of {cases[i]:#010x}: {whole[i]:#x} vectorized, "
                      f"{single:#x} alone", file=sys.stderr)
        return whole

    bf16 = encode(torch.bfloat16)
    f16 = encode(torch.float16)
    e4m3 = encode(torch.float8_e4m3fn)
    e5m2 = encode(torch.float8_e5m2)
    e4m3_sat = encode(torch.float8_e4m3fn, 448.0)
    e5m2_sat = encode(torch.float8_e5m2, 57344.0)

    w = sys.stdout.write
    w("// Generated by tests/core/golden/generate_dtype_golden.py with torch "
      f"{torch.__version__}; do not edit.\n")
    w("// PyTorch's own casts (tensor.to(dtype) and tensor.float() on the CPU), recorded so that\n")
    w("// dtype_golden_test.cpp can check asynctp's conversions against them without torch.\n")
    w("#pragma once\n\n#include <cstdint>\n\nnamespace asynctp::golden {\n\n")
    w(f'inline constexpr char kTorchVersion[] = "{torch.__version__}";\n\n')
    for name, dtype in (("kE4M3ToF32", torch.float8_e4m3fn), ("kE5M2ToF32", torch.float8_e5m2)):
        w(f"// f32 bit pattern of every {dtype} bit pattern 0x00..0xFF, decoded by torch.\n")
        w(f"inline constexpr uint32_t {name}[256] = {{\n")
        w(", ".join(f"{v & 0xFFFFFFFF:#010x}u" for v in decode_all(dtype, 8)))
        w("};\n\n")
    w("// FNV-1a (64-bit, over the little-endian bytes) of the f32 bit patterns of every 16-bit\n")
    w("// pattern 0x0000..0xFFFF decoded by torch.\n")
    w(f"inline constexpr uint64_t kF16ToF32Hash = {fnv1a(decode_all(torch.float16, 16)):#x}ull;\n")
    w(f"inline constexpr uint64_t kBF16ToF32Hash = {fnv1a(decode_all(torch.bfloat16, 16)):#x}ull;\n\n")
    w("struct EncodeCase {\n  uint32_t f32;\n  uint16_t bf16;\n  uint16_t f16;\n  uint8_t e4m3;\n"
      "  uint8_t e5m2;\n  uint8_t e4m3_saturated;  // x.clamp(-448, 448).to(float8_e4m3fn)\n"
      "  uint8_t e5m2_saturated;  // x.clamp(-57344, 57344).to(float8_e5m2)\n};\n\n")
    w("// {f32 bits, bf16, f16, e4m3fn, e5m2, e4m3fn saturated, e5m2 saturated}\n")
    w("inline constexpr EncodeCase kEncodeCases[] = {\n")
    for row in zip(cases, bf16, f16, e4m3, e5m2, e4m3_sat, e5m2_sat):
        w("    {{{:#010x}u, {:#06x}, {:#06x}, {:#04x}, {:#04x}, {:#04x}, {:#04x}}},\n".format(*row))
    w("};\n\n}  // namespace asynctp::golden\n")


if __name__ == "__main__":
    main()
