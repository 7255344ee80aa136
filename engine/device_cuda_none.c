/* device_cuda_none.c: what a build without nvcc links instead of device_cuda.c: no cuda device. */
#include <stddef.h>

#include "engine/device.h"

const struct mge_device *mge_device_cuda(void)
{
    return NULL;
}
