/* comm_nccl_none.c: what a build without CUDA/NCCL links instead of comm_nccl.c: nccl is refused.
 */
#include <stdio.h>

#include "common/err.h"
#include "engine/comm/comm_int.h"

const int mge__comm_nccl_built = 0;

int mge__comm_nccl_open(struct mge_comm **out, const struct mge_comm_env *env, char *err,
                        size_t errlen)
{
    (void)env;
    *out = NULL;
    snprintf(err, errlen,
             "distributed.backend: nccl is not built into this mge-train (no nvcc "
             "and NCCL at build time: install the CUDA toolkit with NCCL and rebuild)");
    return MGE_UNSUPPORTED;
}
