/* rng.h: xoshiro256** random numbers, seeded by splitmix64; state is 4 words (checkpointed). */
#ifndef MGE_COMMON_RNG_H
#define MGE_COMMON_RNG_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mge_rng {
    uint64_t s[4];
};

/* Seed @r from @seed (any value, 0 included). */
void mge_rng_seed(struct mge_rng *r, uint64_t seed);
uint64_t mge_rng_next(struct mge_rng *r);
/* Uniform in [0, 1) with 24 bits. */
float mge_rng_float(struct mge_rng *r);
/* Uniform in [0, n) without modulo bias; n >= 1. */
uint64_t mge_rng_below(struct mge_rng *r, uint64_t n);
/* splitmix64's finaliser: a bijective 64-bit mix (Stafford's variant 13). */
static inline uint64_t mge_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* One splitmix64 step: a good 64-bit hash of @x (inline: dropout calls it per element). */
static inline uint64_t mge_splitmix64(uint64_t x)
{
    return mge_mix64(x + 0x9E3779B97F4A7C15ull);
}

#ifdef __cplusplus
}
#endif
#endif
