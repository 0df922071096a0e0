// Decode attention over the paged KV cache on CPU (gpu_workers/engine/layers/attention.py calls it): for every
// sequence b and query head h (kv head h / (num_heads / num_kv_heads), as SDPA's enable_gqa):
//     out[b, h, :] = softmax(scale * q[b, h, :] . K_b[p, :]) @ V_b[p, :]     over positions p < lens[b]
// where K_b[p] / V_b[p] are read in place from the cache at slot tables[b, p / block_size] * block_size +
// p % block_size: no gathered copy of the pages, and no position at or beyond lens[b] is ever read (a
// neighbour's pages cannot reach a sequence's output).
//
// q, out: [num_seqs, num_heads, head_dim] contiguous; k_cache, v_cache: [num_slots, num_kv_heads, head_dim]
// contiguous; tables: [num_seqs, max_blocks] int64; lens: [num_seqs] int64 (>= 1).
// Numerics: fp32 scores, softmax and accumulation; the output is rounded once to the model dtype (bf16.h).
// One work item per sequence: each position's K (then V) row of all kv heads is read once, in page order
// (contiguous runs the hardware prefetches: the pages are cold, the layer's weights have passed since).

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#if defined(__x86_64__) && defined(__GLIBC__) && !defined(__FAST_MATH__)
// glibc's vector expf (libmvec, <= 4 ulp), declared as its math.h does under -ffast-math, so the softmax's
// exponentials vectorize without relaxing the rest of the arithmetic.
__attribute__((__simd__("notinbranch"))) extern float expf(float);
#endif

#define DEFINE_DECODE_ATTENTION(NAME, T, TO_FLOAT, FROM_FLOAT)                                               \
void NAME(const T* q, T* out, const T* k_cache, const T* v_cache, const int64_t* tables, int64_t max_blocks,  \
          const int64_t* lens, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,   \
          int64_t block_size, float scale, int num_threads) {                                                 \
    const int64_t group = num_heads / num_kv_heads, row = num_kv_heads * head_dim;                            \
    int64_t max_len = 1;                                                                                      \
    for (int64_t b = 0; b < num_seqs; ++b) max_len = lens[b] > max_len ? lens[b] : max_len;                   \
    _Pragma("omp parallel num_threads(num_threads)")                                                          \
    {                                                                                                         \
        float* scores = (float*)malloc(sizeof(float) * num_heads * max_len);                                 \
        float* qf = (float*)malloc(sizeof(float) * num_heads * head_dim);                                    \
        float* acc = (float*)malloc(sizeof(float) * num_heads * head_dim);                                   \
        float* rowf = (float*)malloc(sizeof(float) * row); /* one position's K or V row in fp32 */           \
        _Pragma("omp for schedule(dynamic, 1)")                                                               \
        for (int64_t b = 0; b < num_seqs; ++b) {                                                              \
            const int64_t len = lens[b];                                                                      \
            const int64_t* table = tables + b * max_blocks;                                                   \
            const T* q_b = q + b * num_heads * head_dim;                                                      \
            for (int64_t i = 0; i < num_heads * head_dim; ++i) qf[i] = TO_FLOAT(q_b[i]) * scale;              \
            /* pass 1: scores; one position's K row (all kv heads) is contiguous, a page's rows too */         \
            for (int64_t p = 0; p < len; ++p) {                                                               \
                const T* k_row = k_cache + (table[p / block_size] * block_size + p % block_size) * row;       \
                _Pragma("omp simd")                                                                           \
                for (int64_t i = 0; i < row; ++i) rowf[i] = TO_FLOAT(k_row[i]);                               \
                for (int64_t h = 0; h < num_heads; ++h) {                                                     \
                    const float* k = rowf + (h / group) * head_dim;                                           \
                    const float* qh = qf + h * head_dim;                                                      \
                    float s = 0.0f;                                                                           \
                    _Pragma("omp simd reduction(+:s)")                                                        \
                    for (int64_t d = 0; d < head_dim; ++d) s += qh[d] * k[d];                                 \
                    scores[h * max_len + p] = s;                                                              \
                }                                                                                             \
            }                                                                                                 \
            for (int64_t h = 0; h < num_heads; ++h) {                                                         \
                float* sh = scores + h * max_len;                                                             \
                float m = sh[0];                                                                              \
                for (int64_t p = 1; p < len; ++p) m = sh[p] > m ? sh[p] : m;                                  \
                float sum = 0.0f;                                                                             \
                _Pragma("omp simd")                                                                           \
                for (int64_t p = 0; p < len; ++p) sh[p] = expf(sh[p] - m);                                    \
                for (int64_t p = 0; p < len; ++p) sum += sh[p];                                               \
                const float inv = 1.0f / sum;                                                                 \
                for (int64_t p = 0; p < len; ++p) sh[p] *= inv;                                               \
            }                                                                                                 \
            /* pass 2: probabilities times V rows */                                                          \
            memset(acc, 0, sizeof(float) * num_heads * head_dim);                                             \
            for (int64_t p = 0; p < len; ++p) {                                                               \
                const T* v_row = v_cache + (table[p / block_size] * block_size + p % block_size) * row;       \
                _Pragma("omp simd")                                                                           \
                for (int64_t i = 0; i < row; ++i) rowf[i] = TO_FLOAT(v_row[i]);                               \
                for (int64_t h = 0; h < num_heads; ++h) {                                                     \
                    const float* v = rowf + (h / group) * head_dim;                                           \
                    const float w = scores[h * max_len + p];                                                  \
                    float* a = acc + h * head_dim;                                                            \
                    _Pragma("omp simd")                                                                       \
                    for (int64_t d = 0; d < head_dim; ++d) a[d] += w * v[d];                                  \
                }                                                                                             \
            }                                                                                                 \
            T* o = out + b * num_heads * head_dim;                                                            \
            for (int64_t i = 0; i < num_heads * head_dim; ++i) o[i] = FROM_FLOAT(acc[i]);                     \
        }                                                                                                     \
        free(scores);                                                                                         \
        free(qf);                                                                                             \
        free(acc);                                                                                            \
        free(rowf);                                                                                           \
    }                                                                                                         \
}

static inline float attention_identity(float f) { return f; }

DEFINE_DECODE_ATTENTION(decode_attention_bf16, bf16_t, bf16_to_float, float_to_bf16)
DEFINE_DECODE_ATTENTION(decode_attention_f32, float, attention_identity, attention_identity)
