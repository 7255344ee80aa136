/* rng.c: xoshiro256** (Blackman and Vigna) and splitmix64. */
#include "rng.h"

void mge_rng_seed(struct mge_rng *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) {
        x += 0x9E3779B97F4A7C15ull;
        r->s[i] = mge_splitmix64(x);
    }
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t mge_rng_next(struct mge_rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float mge_rng_float(struct mge_rng *r) { return (float)(mge_rng_next(r) >> 40) * (1.0f / 16777216.0f); }

uint64_t mge_rng_below(struct mge_rng *r, uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = mge_rng_next(r);
    while (x >= limit);
    return x % n;
}
