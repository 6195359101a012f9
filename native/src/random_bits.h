/* The counter-based random streams the CPU and CUDA kernels share: element `counter` of the
 * stream `key` is a hash of the pair, so a seed gives the same numbers on any thread count,
 * launch configuration or device. Not part of the ABI. An includer may define IT_RNG_FN first
 * (CUDA: __host__ __device__ __forceinline__). */
#ifndef IT_RANDOM_BITS_H
#define IT_RANDOM_BITS_H

#include <stdint.h>

#ifndef IT_RNG_FN
#define IT_RNG_FN static inline
#endif

IT_RNG_FN uint64_t mix64(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

IT_RNG_FN uint64_t random_bits(uint64_t key, uint64_t counter) {
    return mix64(mix64(counter * 0x9e3779b97f4a7c15ull + key) ^ key);
}

/* Uniform double in (0, 1], 53 random bits. */
IT_RNG_FN double uniform_open0(uint64_t bits) {
    return ((double)(bits >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

/* Attention dropout: the stream of a seed, and whether it keeps probability j of query row
 * `row` (b·H·Tq + h·Tq + i) of a [.., Tk] score block. drop_below = p · 2^32: the top 32 bits
 * of the hash fall below it with probability p. */
IT_RNG_FN uint64_t attention_dropout_key(uint64_t seed) { return mix64(seed ^ 0x8cb92ba72f3d8dd7ull); }
IT_RNG_FN int attention_keeps(uint64_t key, uint64_t row, int64_t Tk, int64_t j, uint64_t drop_below) {
    return (random_bits(key, row * (uint64_t)Tk + (uint64_t)j) >> 32) >= drop_below;
}

#endif
