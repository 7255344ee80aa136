/* isa.c: which instruction set the cloned kernels run with here (see cpu.h, cpu_int.h). */
#include "kernels/cpu/cpu_int.h"

const char *mge_cpu_isa(void)
{
#if defined(MGE_NO_CLONES)
    return "native";
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    /* the same tests the clones' resolvers make */
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4"))
        return "x86-64-v4";
    if (__builtin_cpu_supports("x86-64-v3"))
        return "x86-64-v3";
    return "baseline";
#else
    return "baseline";
#endif
}
