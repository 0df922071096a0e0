// Decode attention over the paged KV cache on CPU (gpu_workers/layers/attention.py calls it): for every
// sequence b and query head h (kv head h / (num_heads / num_kv_heads), as SDPA's enable_gqa):
//     out[b, h, :] = softmax(scale * q[b, h, :] . K_b[p, :]) @ V_b[p, :]     over positions p < lens[b]
// where K_b[p] / V_b[p] are read in place from the cache at slot tables[b, p / block_size] * block_size +
// p % block_size: no gathered copy of the pages, and no position at or beyond lens[b] is ever read (a
// neighbour's pages cannot reach a sequence's output).
//
// q, out: [num_seqs, num_heads, head_dim] contiguous; k_cache, v_cache: [num_slots, num_kv_heads, head_dim]
// contiguous; tables: [num_seqs, max_blocks] int64; lens: [num_seqs] int64 (>= 1).
// Numerics: fp32 scores, softmax and accumulation; the output is rounded once to the model dtype (bf16.h).
// One work item per (sequence, kv head): the kv head's K and V rows are read once for all its query heads.

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#define DEFINE_DECODE_ATTENTION(NAME, T, TO_FLOAT, FROM_FLOAT)                                               \
void NAME(const T* q, T* out, const T* k_cache, const T* v_cache, const int64_t* tables, int64_t max_blocks,  \
          const int64_t* lens, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,   \
          int64_t block_size, float scale, int num_threads) {                                                 \
    const int64_t group = num_heads / num_kv_heads;                                                           \
    int64_t max_len = 1;                                                                                      \
    for (int64_t b = 0; b < num_seqs; ++b) max_len = lens[b] > max_len ? lens[b] : max_len;                   \
    _Pragma("omp parallel num_threads(num_threads)")                                                          \
    {                                                                                                         \
        float* scores = (float*)malloc(sizeof(float) * group * max_len);                                     \
        float* qf = (float*)malloc(sizeof(float) * group * head_dim);                                        \
        float* acc = (float*)malloc(sizeof(float) * group * head_dim);                                       \
        _Pragma("omp for schedule(dynamic, 1) collapse(2)")                                                   \
        for (int64_t b = 0; b < num_seqs; ++b) {                                                              \
            for (int64_t kvh = 0; kvh < num_kv_heads; ++kvh) {                                                \
                const int64_t len = lens[b];                                                                  \
                const int64_t* table = tables + b * max_blocks;                                               \
                const T* q_b = q + (b * num_heads + kvh * group) * head_dim;                                  \
                for (int64_t i = 0; i < group * head_dim; ++i) qf[i] = TO_FLOAT(q_b[i]) * scale;              \
                for (int64_t p = 0; p < len; ++p) {                                                           \
                    const int64_t slot = table[p / block_size] * block_size + p % block_size;                \
                    const T* k = k_cache + (slot * num_kv_heads + kvh) * head_dim;                            \
                    for (int64_t g = 0; g < group; ++g) {                                                     \
                        const float* qg = qf + g * head_dim;                                                  \
                        float s = 0.0f;                                                                       \
                        _Pragma("omp simd reduction(+:s)")                                                    \
                        for (int64_t d = 0; d < head_dim; ++d) s += qg[d] * TO_FLOAT(k[d]);                   \
                        scores[g * max_len + p] = s;                                                          \
                    }                                                                                         \
                }                                                                                             \
                for (int64_t g = 0; g < group; ++g) {                                                         \
                    float* sg = scores + g * max_len;                                                         \
                    float m = sg[0];                                                                          \
                    for (int64_t p = 1; p < len; ++p) m = sg[p] > m ? sg[p] : m;                              \
                    float sum = 0.0f;                                                                         \
                    for (int64_t p = 0; p < len; ++p) { sg[p] = expf(sg[p] - m); sum += sg[p]; }              \
                    const float inv = 1.0f / sum;                                                             \
                    for (int64_t p = 0; p < len; ++p) sg[p] *= inv;                                           \
                }                                                                                             \
                memset(acc, 0, sizeof(float) * group * head_dim);                                             \
                for (int64_t p = 0; p < len; ++p) {                                                           \
                    const int64_t slot = table[p / block_size] * block_size + p % block_size;                \
                    const T* v = v_cache + (slot * num_kv_heads + kvh) * head_dim;                            \
                    for (int64_t g = 0; g < group; ++g) {                                                     \
                        const float w = scores[g * max_len + p];                                              \
                        float* a = acc + g * head_dim;                                                        \
                        _Pragma("omp simd")                                                                   \
                        for (int64_t d = 0; d < head_dim; ++d) a[d] += w * TO_FLOAT(v[d]);                    \
                    }                                                                                         \
                }                                                                                             \
                T* o = out + (b * num_heads + kvh * group) * head_dim;                                        \
                for (int64_t i = 0; i < group * head_dim; ++i) o[i] = FROM_FLOAT(acc[i]);                     \
            }                                                                                                 \
        }                                                                                                     \
        free(scores);                                                                                         \
        free(qf);                                                                                             \
        free(acc);                                                                                            \
    }                                                                                                         \
}

static inline float attention_identity(float f) { return f; }

DEFINE_DECODE_ATTENTION(decode_attention_bf16, bf16_t, bf16_to_float, float_to_bf16)
DEFINE_DECODE_ATTENTION(decode_attention_f32, float, attention_identity, attention_identity)
