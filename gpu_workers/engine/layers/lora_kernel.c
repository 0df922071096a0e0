// Segmented LoRA delta on CPU (gpu_workers/engine/layers/lora_kernel.py builds and calls it):
// for every adapter p of a batch, for its tokens [seg[2p], seg[2p+1]) of x:
//     xa = round(x_rows @ A_p)                      (fp32 accumulation, rounded to the model dtype)
//     out_rows[:, c0:c1] = round(out_rows[:, c0:c1] + xa[:, r0:r1] @ B_p,part)   for each part
// reading each adapter's A and B once per block of up to TOKEN_BLOCK tokens (decode: one token per adapter
// reads exactly the adapter's weights), never multiplying a token by another adapter's weights.
//
// desc (int64; adapter p's row at desc + p * desc_stride): a_ptr, lda, rank_cols, num_parts, then per part
// (r0, r1, c0, c1, b_ptr, ldb). A: [in_features, rank_cols] rows of stride lda; B: [r1 - r0, c1 - c0] rows of
// stride ldb. rank_cols == 0: the adapter does not target this projection.
// Rounding matches torch (bf16.h).

#include <stdint.h>
#include <string.h>

#include "bf16.h"

#define MAX_PARTS 3
#define DESC_STRIDE (4 + 6 * MAX_PARTS)
#define TOKEN_BLOCK 8
#define MAX_RANK_COLS 3072
#define COL_BLOCK 512

#define DEFINE_DELTA(NAME, T, TO_FLOAT, FROM_FLOAT, ROUND)                                                   \
static void NAME##_one(const T* x, int64_t ldx, T* out, int64_t ldout, int64_t in_features,                   \
                       const int64_t* d, int64_t t0, int64_t t1) {                                            \
    const T* a = (const T*)(intptr_t)d[0];                                                                    \
    const int64_t lda = d[1], rank_cols = d[2], num_parts = d[3];                                             \
    float xa[TOKEN_BLOCK][MAX_RANK_COLS];                                                                     \
    float acc[COL_BLOCK];                                                                                     \
    for (int64_t tb = t0; tb < t1; tb += TOKEN_BLOCK) {                                                       \
        const int64_t nt = (t1 - tb) < TOKEN_BLOCK ? (t1 - tb) : TOKEN_BLOCK;                                 \
        for (int64_t t = 0; t < nt; ++t) memset(xa[t], 0, sizeof(float) * rank_cols);                         \
        for (int64_t k = 0; k < in_features; ++k) {                                                           \
            const T* a_row = a + k * lda;                                                                     \
            for (int64_t t = 0; t < nt; ++t) {                                                                \
                const float xv = TO_FLOAT(x[(tb + t) * ldx + k]);                                             \
                float* xa_t = xa[t];                                                                          \
                for (int64_t r = 0; r < rank_cols; ++r) xa_t[r] += xv * TO_FLOAT(a_row[r]);                   \
            }                                                                                                 \
        }                                                                                                     \
        for (int64_t t = 0; t < nt; ++t)                                                                      \
            for (int64_t r = 0; r < rank_cols; ++r) xa[t][r] = ROUND(xa[t][r]);                               \
        for (int64_t p = 0; p < num_parts; ++p) {                                                             \
            const int64_t* part = d + 4 + 6 * p;                                                              \
            const int64_t r0 = part[0], r1 = part[1], c0 = part[2], c1 = part[3], ldb = part[5];              \
            const T* b = (const T*)(intptr_t)part[4];                                                         \
            for (int64_t cb = c0; cb < c1; cb += COL_BLOCK) {                                                 \
                const int64_t cols = (c1 - cb) < COL_BLOCK ? (c1 - cb) : COL_BLOCK;                           \
                for (int64_t t = 0; t < nt; ++t) {                                                            \
                    memset(acc, 0, sizeof(float) * cols);                                                     \
                    for (int64_t r = r0; r < r1; ++r) {                                                       \
                        const float xv = xa[t][r];                                                            \
                        const T* b_row = b + (r - r0) * ldb + (cb - c0);                                      \
                        for (int64_t c = 0; c < cols; ++c) acc[c] += xv * TO_FLOAT(b_row[c]);                 \
                    }                                                                                         \
                    T* o = out + (tb + t) * ldout + cb;                                                       \
                    for (int64_t c = 0; c < cols; ++c) o[c] = FROM_FLOAT(TO_FLOAT(o[c]) + acc[c]);            \
                }                                                                                             \
            }                                                                                                 \
        }                                                                                                     \
    }                                                                                                         \
}                                                                                                             \
void NAME(const T* x, int64_t ldx, T* out, int64_t ldout, int64_t in_features, int64_t num_adapters,          \
          const int64_t* desc, int64_t desc_stride, const int64_t* seg, const int64_t* order, int num_threads) { \
    _Pragma("omp parallel for schedule(dynamic, 1) num_threads(num_threads)")                                \
    for (int64_t i = 0; i < num_adapters; ++i) {                                                              \
        const int64_t p = order[i];                                                                           \
        const int64_t* d = desc + p * desc_stride;                                                            \
        if (d[2] == 0 || seg[2 * p + 1] <= seg[2 * p]) continue;                                              \
        NAME##_one(x, ldx, out, ldout, in_features, d, seg[2 * p], seg[2 * p + 1]);                           \
    }                                                                                                         \
}

static inline float identity_float(float f) { return f; }
static inline float float_identity(float f) { return f; }

DEFINE_DELTA(lora_delta_bf16, bf16_t, bf16_to_float, float_to_bf16, round_bf16)
DEFINE_DELTA(lora_delta_f32, float, identity_float, float_identity, float_identity)

int lora_kernel_abi(void) { return 1; }
