// Shared by the engine's C kernels (layers/*_kernel.c): bf16 <-> fp32 conversions that round as torch does
// (round to nearest even, NaN -> 0x7fc0).
#ifndef LORAHOST_BF16_H
#define LORAHOST_BF16_H

#include <stdint.h>

typedef uint16_t bf16_t;

static inline float bf16_to_float(bf16_t h) {
    union { uint32_t u; float f; } v;
    v.u = ((uint32_t)h) << 16;
    return v.f;
}

static inline bf16_t float_to_bf16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)0x7fc0;
    uint32_t rounded = v.u + 0x7fffu + ((v.u >> 16) & 1u);
    return (bf16_t)(rounded >> 16);
}

static inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

#endif
