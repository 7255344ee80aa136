/*
 * safetensors.h: weights in the safetensors format, the file PyTorch users exchange
 * (mge-export writes it, mge-train --init-from reads it).
 *
 * File layout: an 8-byte little-endian header length N, N bytes of a JSON object
 * {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {"key": "string", ...}} padded with spaces to a multiple of 8, then the
 * tensors' raw little-endian bytes; offsets are relative to the end of the header.
 */
#ifndef MGE_ENGINE_SAFETENSORS_H
#define MGE_ENGINE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "engine/ckpt.h"

#define MGE_SAFETENSORS_HEADER_MAX (100u << 20) /* the reference implementation's limit */

struct mge_safetensors {
    struct mge_ckpt_tensor *tensors; /* (n_tensors) in the header's order; F32 or I64 */
    int n_tensors;
    void *priv; /* the file image and names the tensors point into (data may be unaligned) */
};

/*
 * Write @n tensors of @ts (dtype MGE_CKPT_F32, or MGE_CKPT_I64 for counters) to @path in file
 * order, with the metadata
 * @meta: NULL or pairs of strings key, value, ..., ended by a NULL key. The file is written
 * to "<path>.tmp.<pid>" and renamed over @path. Returns MGE_OK, MGE_INVAL (a tensor of another
 * dtype, or a name twice), MGE_IO (cannot create, write or rename: no temp file is left),
 * MGE_NOMEM; @err (if not NULL) gets a message naming @path. Thread: any.
 */
int mge_safetensors_write(const char *path, const struct mge_ckpt_tensor *ts, int n,
                          const char *const *meta, char *err, size_t errlen);

/*
 * Parse and validate the file image @buf/@len (untrusted): header length within the file and
 * MGE_SAFETENSORS_HEADER_MAX, a JSON object without duplicate keys, "__metadata__" an object
 * of strings, each tensor exactly {dtype, shape, data_offsets} with dtype "F32" or "I64" (PyTorch's
 * batch-norm counters), at most MGE_CKPT_MAX_DIMS non-negative dims, end - begin ==
 * dtype size * product(shape), and the tensors'
 * ranges inside the data, non-overlapping and covering it without gaps (as the reference
 * implementation requires). @buf is copied. Returns MGE_OK, MGE_FORMAT (anything above broken;
 * @err names the tensor and the rule), MGE_UNSUPPORTED (another dtype), MGE_NOMEM. On error
 * *@out is NULL; on MGE_OK it belongs to the caller: mge_safetensors_free(). Never crashes on
 * any input (fuzzed). Thread: any.
 */
int mge_safetensors_decode(const void *buf, size_t len, struct mge_safetensors **out, char *err,
                           size_t errlen);

/* As mge_safetensors_decode() on the file at @path (messages name it); MGE_NOENT or MGE_IO
 * when it cannot be read. */
int mge_safetensors_read(const char *path, struct mge_safetensors **out, char *err, size_t errlen);

/* The tensor called @name, or NULL. Linear in n_tensors. */
const struct mge_ckpt_tensor *mge_safetensors_find(const struct mge_safetensors *st,
                                                   const char *name);

/* Free what decode/read returned; NULL does nothing. */
void mge_safetensors_free(struct mge_safetensors *st);

#endif
