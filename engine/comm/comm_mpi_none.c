/* comm_mpi_none.c: what a build without Open MPI links instead of comm_mpi.c: mpi is refused. */
#include <stdio.h>

#include "common/err.h"
#include "engine/comm/comm_int.h"

const int mge__comm_mpi_built = 0;

int mge__comm_mpi_open(struct mge_comm **out, const struct mge_comm_env *env, char *err,
                       size_t errlen)
{
    (void)env;
    *out = NULL;
    snprintf(err, errlen,
             "distributed.backend: mpi is not built into this mge-train (no Open "
             "MPI development files at build time: install libopenmpi-dev and rebuild)");
    return MGE_UNSUPPORTED;
}
