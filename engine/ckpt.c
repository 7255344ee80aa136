/* ckpt.c: checkpoint files: header + CRC framing around a protobuf-c payload, atomic writes. */
#include "engine/ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/alloc.h"
#include "common/err.h"
#include "proto/checkpoint.pb-c.h"

#define SINK_BUF_SIZE ((size_t)1 << 20)
/* protobuf-c sizes are size_t but one message is limited in practice; refuse absurd payloads
 * before allocating them. */
#define PAYLOAD_MAX ((uint64_t)1 << 40)

/* fail(code, err, errlen, fmt, ...): fill @err and log once where the error starts; returns
 * @code (common/err.h) */
#define fail MGE_ERR_FILL

size_t mge_ckpt_dtype_size(int dtype)
{
    static const size_t sizes[MGE_CKPT_DTYPE__COUNT] = {
        [MGE_CKPT_F32] = 4, [MGE_CKPT_F16] = 2, [MGE_CKPT_BF16] = 2, [MGE_CKPT_F64] = 8,
        [MGE_CKPT_I32] = 4, [MGE_CKPT_I64] = 8, [MGE_CKPT_U8] = 1,   [MGE_CKPT_I8] = 1,
    };
    if (dtype < 0 || dtype >= MGE_CKPT_DTYPE__COUNT)
        return 0;
    return sizes[dtype];
}

/* ---- validation, shared by write and read ---- */

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/*
 * Check one tensor's header against its data size. @what is the file (or "checkpoint" when
 * writing) for messages. Returns MGE_OK or @code.
 */
static int check_tensor(const char *what, int code, int i, const char *name, int dtype, size_t ndim,
                        const int64_t *shape, size_t nbytes, char *err, size_t errlen)
{
    size_t esize = mge_ckpt_dtype_size(dtype);
    uint64_t count = 1;
    if (!name || !name[0])
        return fail(code, err, errlen, "%s: tensor %d has no name", what, i);
    if (!esize)
        return fail(code, err, errlen, "%s: tensor '%s' has unknown dtype %d", what, name, dtype);
    if (ndim > MGE_CKPT_MAX_DIMS)
        return fail(code, err, errlen, "%s: tensor '%s' has %zu dims (at most %d)", what, name,
                    ndim, MGE_CKPT_MAX_DIMS);
    for (size_t d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return fail(code, err, errlen, "%s: tensor '%s' has negative dim %lld", what, name,
                        (long long)shape[d]);
        if (shape[d] > 0 && count > (uint64_t)SIZE_MAX / esize / (uint64_t)shape[d])
            return fail(code, err, errlen, "%s: tensor '%s' shape overflows", what, name);
        count *= (uint64_t)shape[d];
    }
    if (count * esize != nbytes)
        return fail(code, err, errlen,
                    "%s: tensor '%s' has %zu bytes but its shape and dtype need %llu", what, name,
                    nbytes, (unsigned long long)(count * esize));
    return MGE_OK;
}

/* Names must be unique; @names is sorted in place. */
static int check_unique(const char *what, int code, const char **names, size_t n, char *err,
                        size_t errlen)
{
    qsort(names, n, sizeof(*names), cmp_names);
    for (size_t i = 1; i < n; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            return fail(code, err, errlen, "%s: tensor name '%s' appears twice", what, names[i]);
    return MGE_OK;
}

static int check_scalars(const char *what, int code, int64_t step, int64_t epoch, int64_t pos,
                         int64_t optim_step, int optim_type, size_t n_rng, char *err, size_t errlen)
{
    if (step < 0 || epoch < 0 || pos < 0 || optim_step < 0)
        return fail(code, err, errlen,
                    "%s: negative position (step %lld, epoch %lld, sampler_pos %lld, "
                    "optim_step %lld)",
                    what, (long long)step, (long long)epoch, (long long)pos, (long long)optim_step);
    if (optim_type < 0 || optim_type >= MGE_CKPT_OPTIM__COUNT)
        return fail(code, err, errlen, "%s: unknown optimiser type %d", what, optim_type);
    if (n_rng > MGE_CKPT_RNG_MAX)
        return fail(code, err, errlen, "%s: %zu rng words (at most %d)", what, n_rng,
                    MGE_CKPT_RNG_MAX);
    return MGE_OK;
}

static int check_ckpt(const struct mge_ckpt *ck, char *err, size_t errlen)
{
    const char **names;
    int rc =
        check_scalars("checkpoint", MGE_INVAL, ck->step, ck->epoch, ck->sampler_pos, ck->optim_step,
                      ck->optim_type, (size_t)(ck->n_rng < 0 ? 0 : ck->n_rng), err, errlen);
    if (rc != MGE_OK)
        return rc;
    if (ck->n_rng < 0 || ck->n_tensors < 0 || (ck->n_tensors > 0 && !ck->tensors))
        return fail(MGE_INVAL, err, errlen, "checkpoint: bad counts");
    for (int i = 0; i < ck->n_tensors; i++) {
        const struct mge_ckpt_tensor *t = &ck->tensors[i];
        if (t->ndim < 0)
            return fail(MGE_INVAL, err, errlen, "checkpoint: tensor %d has negative ndim", i);
        rc = check_tensor("checkpoint", MGE_INVAL, i, t->name, t->dtype, (size_t)t->ndim, t->shape,
                          t->nbytes, err, errlen);
        if (rc != MGE_OK)
            return rc;
        if (t->nbytes && !t->data)
            return fail(MGE_INVAL, err, errlen, "checkpoint: tensor '%s' has no data", t->name);
    }
    names = mge_malloc((size_t)ck->n_tensors * sizeof(*names));
    if (!names)
        return fail(MGE_NOMEM, err, errlen, "checkpoint: out of memory");
    for (int i = 0; i < ck->n_tensors; i++)
        names[i] = ck->tensors[i].name;
    rc = check_unique("checkpoint", MGE_INVAL, names, (size_t)ck->n_tensors, err, errlen);
    mge_free(names);
    return rc;
}

/* ---- encoding ---- */

/* The message for @ck, borrowing its arrays and data; free with message_fini(). */
struct message {
    Mge__Ckpt__Checkpoint msg;
    Mge__Ckpt__Tensor *tmsgs;
    Mge__Ckpt__Tensor **tptrs;
};

static int message_init(struct message *m, const struct mge_ckpt *ck, char *err, size_t errlen)
{
    Mge__Ckpt__Checkpoint init = MGE__CKPT__CHECKPOINT__INIT;
    int rc = check_ckpt(ck, err, errlen);
    if (rc != MGE_OK)
        return rc;
    m->msg = init;
    m->tmsgs = mge_malloc((size_t)ck->n_tensors * sizeof(*m->tmsgs));
    m->tptrs = mge_malloc((size_t)ck->n_tensors * sizeof(*m->tptrs));
    if (!m->tmsgs || !m->tptrs) {
        mge_free(m->tmsgs);
        mge_free(m->tptrs);
        return fail(MGE_NOMEM, err, errlen, "checkpoint: out of memory");
    }
    m->msg.format_version = MGE_CKPT_VERSION;
    m->msg.step = ck->step;
    m->msg.epoch = ck->epoch;
    m->msg.sampler_pos = ck->sampler_pos;
    m->msg.n_rng_state = (size_t)ck->n_rng;
    /* protobuf-c only reads these while packing; the casts drop const, not ownership. */
    m->msg.rng_state = (uint64_t *)ck->rng;
    m->msg.optim_type = (Mge__Ckpt__OptimType)ck->optim_type;
    m->msg.optim_step = ck->optim_step;
    m->msg.spec_yaml = ck->spec_yaml ? (char *)ck->spec_yaml : (char *)protobuf_c_empty_string;
    m->msg.last_loss = ck->last_loss;
    m->msg.test_accuracy = ck->test_accuracy;
    m->msg.n_tensors = (size_t)ck->n_tensors;
    m->msg.tensors = m->tptrs;
    for (int i = 0; i < ck->n_tensors; i++) {
        const struct mge_ckpt_tensor *t = &ck->tensors[i];
        Mge__Ckpt__Tensor tinit = MGE__CKPT__TENSOR__INIT;
        m->tmsgs[i] = tinit;
        m->tmsgs[i].name = (char *)t->name;
        m->tmsgs[i].dtype = (Mge__Ckpt__DType)t->dtype;
        m->tmsgs[i].n_shape = (size_t)t->ndim;
        m->tmsgs[i].shape = (int64_t *)t->shape;
        m->tmsgs[i].data.len = t->nbytes;
        m->tmsgs[i].data.data = t->data;
        m->tptrs[i] = &m->tmsgs[i];
    }
    return MGE_OK;
}

static void message_fini(struct message *m)
{
    mge_free(m->tmsgs);
    mge_free(m->tptrs);
}

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void header_fill(uint8_t *h, uint64_t len, uint32_t crc)
{
    memcpy(h, MGE_CKPT_MAGIC, 8);
    put_le(h + 8, len, 8);
    put_le(h + 16, crc, 4);
    put_le(h + 20, 0, 4);
}

int mge_ckpt_encode(const struct mge_ckpt *ck, void **buf, size_t *len, char *err, size_t errlen)
{
    struct message m;
    size_t plen;
    uint8_t *out;
    int rc;
    *buf = NULL;
    *len = 0;
    rc = message_init(&m, ck, err, errlen);
    if (rc != MGE_OK)
        return rc;
    plen = mge__ckpt__checkpoint__get_packed_size(&m.msg);
    if (plen > SIZE_MAX - MGE_CKPT_HEADER_SIZE) {
        rc = fail(MGE_TOOBIG, err, errlen, "checkpoint: %zu bytes is too large", plen);
        goto out_fini;
    }
    out = mge_malloc(MGE_CKPT_HEADER_SIZE + plen);
    if (!out) {
        rc = fail(MGE_NOMEM, err, errlen, "checkpoint: cannot allocate %zu bytes", plen);
        goto out_fini;
    }
    mge__ckpt__checkpoint__pack(&m.msg, out + MGE_CKPT_HEADER_SIZE);
    header_fill(out, plen, (uint32_t)crc32_z(0, out + MGE_CKPT_HEADER_SIZE, plen));
    *buf = out;
    *len = MGE_CKPT_HEADER_SIZE + plen;
out_fini:
    message_fini(&m);
    return rc;
}

/* ---- writing: a ProtobufCBuffer that streams to a file and computes the CRC on the way ---- */

struct file_sink {
    ProtobufCBuffer base;
    int fd;
    int err; /* errno of the first failed write; later appends do nothing */
    uint32_t crc;
    uint64_t total; /* payload bytes appended */
    uint8_t *buf;   /* SINK_BUF_SIZE */
    size_t used;
};

static int write_all(int fd, const uint8_t *p, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, p, len > ((size_t)1 << 30) ? ((size_t)1 << 30) : len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? errno : EIO;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void sink_flush(struct file_sink *s)
{
    if (!s->err && s->used)
        s->err = write_all(s->fd, s->buf, s->used);
    s->used = 0;
}

static void sink_append(ProtobufCBuffer *base, size_t len, const uint8_t *data)
{
    struct file_sink *s = (struct file_sink *)base;
    if (s->err)
        return;
    s->crc = (uint32_t)crc32_z(s->crc, data, len);
    s->total += len;
    if (len >= SINK_BUF_SIZE / 2) {
        /* Tensor data: straight to the file, no copy. */
        sink_flush(s);
        if (!s->err)
            s->err = write_all(s->fd, data, len);
        return;
    }
    if (s->used + len > SINK_BUF_SIZE)
        sink_flush(s);
    memcpy(s->buf + s->used, data, len);
    s->used += len;
}

static int fsync_dir(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');
    int fd, rc = 0;
    if (!slash) {
        strcpy(dir, ".");
    } else if (slash == path) {
        strcpy(dir, "/");
    } else {
        size_t n = (size_t)(slash - path);
        if (n >= sizeof(dir))
            return ENAMETOOLONG;
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    if (fsync(fd) != 0 && errno != EINVAL) /* some file systems cannot sync a directory */
        rc = errno;
    close(fd);
    return rc;
}

size_t mge_ckpt_write_buffer_bytes(void) { return SINK_BUF_SIZE; }

int mge_ckpt_write(const char *path, const struct mge_ckpt *ck, char *err, size_t errlen)
{
    static atomic_uint tmp_counter;
    struct message m;
    struct file_sink sink = {.fd = -1};
    uint8_t header[MGE_CKPT_HEADER_SIZE];
    char *tmp;
    size_t plen, tlen = strlen(path) + 64;
    int rc, e;

    if (err && errlen)
        err[0] = '\0';
    rc = message_init(&m, ck, err, errlen);
    if (rc != MGE_OK)
        return rc;
    tmp = mge_malloc(tlen);
    if (!tmp) {
        rc = fail(MGE_NOMEM, err, errlen, "%s: out of memory", path);
        goto out_fini;
    }
    snprintf(tmp, tlen, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&tmp_counter, 1u));
    sink.fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (sink.fd < 0) {
        e = errno;
        rc = fail(e == ENOENT ? MGE_NOENT : MGE_IO, err, errlen, "%s: cannot create '%s': %s", path,
                  tmp, strerror(e));
        goto out_free_tmp;
    }
    sink.buf = mge_malloc(SINK_BUF_SIZE);
    if (!sink.buf) {
        rc = fail(MGE_NOMEM, err, errlen, "%s: cannot allocate a write buffer", path);
        goto err_unlink;
    }
    sink.base.append = sink_append;
    sink.crc = (uint32_t)crc32_z(0, NULL, 0);

    plen = mge__ckpt__checkpoint__get_packed_size(&m.msg);
    header_fill(header, plen, 0); /* CRC patched in below, once known */
    sink.err = write_all(sink.fd, header, sizeof(header));
    if (!sink.err)
        mge__ckpt__checkpoint__pack_to_buffer(&m.msg, &sink.base);
    sink_flush(&sink);
    if (!sink.err && sink.total != plen)
        sink.err = EIO; /* protobuf-c disagreed with itself: never write a bad file */
    if (!sink.err) {
        header_fill(header, plen, sink.crc);
        if (pwrite(sink.fd, header, sizeof(header), 0) != (ssize_t)sizeof(header))
            sink.err = errno ? errno : EIO;
    }
    if (!sink.err && fsync(sink.fd) != 0)
        sink.err = errno;
    if (sink.err) {
        rc = fail(MGE_IO, err, errlen, "%s: cannot write '%s': %s", path, tmp, strerror(sink.err));
        goto err_unlink;
    }
    e = close(sink.fd);
    sink.fd = -1;
    if (e != 0) {
        e = errno;
        rc = fail(MGE_IO, err, errlen, "%s: cannot close '%s': %s", path, tmp, strerror(e));
        goto err_unlink;
    }
    if (rename(tmp, path) != 0) {
        e = errno;
        rc =
            fail(MGE_IO, err, errlen, "%s: cannot rename '%s' over it: %s", path, tmp, strerror(e));
        goto err_unlink;
    }
    /* The data is durable; make the new name durable too. */
    e = fsync_dir(path);
    if (e)
        rc = fail(MGE_IO, err, errlen, "%s: cannot sync its directory: %s", path, strerror(e));
    goto out_free_buf;

err_unlink:
    if (sink.fd >= 0)
        close(sink.fd);
    unlink(tmp);
out_free_buf:
    mge_free(sink.buf);
out_free_tmp:
    mge_free(tmp);
out_fini:
    message_fini(&m);
    return rc;
}

/* ---- reading ---- */

/* protobuf-c allocates through mge_malloc, and remembers whether it ran out. */
struct pb_alloc {
    ProtobufCAllocator base;
    int oom;
};

static void *pb_alloc_fn(void *data, size_t size)
{
    void *p = mge_malloc(size);
    if (!p)
        ((struct pb_alloc *)data)->oom = 1;
    return p;
}

static void pb_free_fn(void *data, void *p)
{
    (void)data;
    mge_free(p);
}

static const ProtobufCAllocator pb_allocator = {pb_alloc_fn, pb_free_fn, NULL};

static void free_message(Mge__Ckpt__Checkpoint *msg)
{
    /* free_unpacked frees through the allocator given here, which must be ours too. */
    struct pb_alloc a = {pb_allocator, 0};
    a.base.allocator_data = &a;
    mge__ckpt__checkpoint__free_unpacked(msg, &a.base);
}

static int validate_message(const char *what, const Mge__Ckpt__Checkpoint *msg, char *err,
                            size_t errlen)
{
    const char **names;
    int rc;
    if (msg->format_version != MGE_CKPT_VERSION)
        return fail(msg->format_version == 0 ? MGE_CORRUPT : MGE_UNSUPPORTED, err, errlen,
                    "%s: format version %u, this build reads %d", what, msg->format_version,
                    MGE_CKPT_VERSION);
    rc = check_scalars(what, MGE_CORRUPT, msg->step, msg->epoch, msg->sampler_pos, msg->optim_step,
                       (int)msg->optim_type, msg->n_rng_state, err, errlen);
    if (rc != MGE_OK)
        return rc;
    if (msg->n_tensors > INT32_MAX)
        return fail(MGE_CORRUPT, err, errlen, "%s: too many tensors", what);
    for (size_t i = 0; i < msg->n_tensors; i++) {
        const Mge__Ckpt__Tensor *t = msg->tensors[i];
        rc = check_tensor(what, MGE_CORRUPT, (int)i, t->name, (int)t->dtype, t->n_shape, t->shape,
                          t->data.len, err, errlen);
        if (rc != MGE_OK)
            return rc;
    }
    names = mge_malloc(msg->n_tensors * sizeof(*names));
    if (!names)
        return fail(MGE_NOMEM, err, errlen, "%s: out of memory", what);
    for (size_t i = 0; i < msg->n_tensors; i++)
        names[i] = msg->tensors[i]->name;
    rc = check_unique(what, MGE_CORRUPT, names, msg->n_tensors, err, errlen);
    mge_free(names);
    return rc;
}

static int decode_payload(const char *what, const uint8_t *p, size_t len, struct mge_ckpt **out,
                          char *err, size_t errlen)
{
    struct pb_alloc a = {pb_allocator, 0};
    Mge__Ckpt__Checkpoint *msg;
    struct mge_ckpt *ck;
    int rc;

    a.base.allocator_data = &a;
    msg = mge__ckpt__checkpoint__unpack(&a.base, len, p);
    if (!msg) {
        if (a.oom)
            return fail(MGE_NOMEM, err, errlen, "%s: out of memory decoding %zu bytes", what, len);
        return fail(MGE_CORRUPT, err, errlen, "%s: payload is not a valid checkpoint message",
                    what);
    }
    rc = validate_message(what, msg, err, errlen);
    if (rc != MGE_OK)
        goto err_free_msg;
    ck = mge_calloc(1, sizeof(*ck));
    if (!ck || !(ck->tensors = mge_calloc(msg->n_tensors, sizeof(*ck->tensors)))) {
        mge_free(ck);
        rc = fail(MGE_NOMEM, err, errlen, "%s: out of memory", what);
        goto err_free_msg;
    }
    ck->version = msg->format_version;
    ck->step = msg->step;
    ck->epoch = msg->epoch;
    ck->sampler_pos = msg->sampler_pos;
    ck->optim_step = msg->optim_step;
    ck->optim_type = (int)msg->optim_type;
    ck->n_rng = (int)msg->n_rng_state;
    for (size_t i = 0; i < msg->n_rng_state; i++)
        ck->rng[i] = msg->rng_state[i];
    ck->spec_yaml = msg->spec_yaml ? msg->spec_yaml : "";
    ck->last_loss = msg->last_loss;
    ck->test_accuracy = msg->test_accuracy;
    ck->n_tensors = (int)msg->n_tensors;
    for (size_t i = 0; i < msg->n_tensors; i++) {
        const Mge__Ckpt__Tensor *t = msg->tensors[i];
        struct mge_ckpt_tensor *d = &ck->tensors[i];
        d->name = t->name;
        d->dtype = (int)t->dtype;
        d->ndim = (int)t->n_shape;
        for (size_t k = 0; k < t->n_shape; k++)
            d->shape[k] = t->shape[k];
        d->data = t->data.data;
        d->nbytes = t->data.len;
    }
    ck->priv = msg;
    *out = ck;
    return MGE_OK;

err_free_msg:
    free_message(msg);
    return rc;
}

/* Check the header of the file image @buf/@len and decode its payload. */
static int decode_image(const char *what, const uint8_t *buf, size_t len, struct mge_ckpt **out,
                        char *err, size_t errlen)
{
    uint64_t plen;
    uint32_t crc, want;
    if (len < MGE_CKPT_HEADER_SIZE)
        return fail(MGE_CORRUPT, err, errlen,
                    "%s: truncated: %zu bytes, shorter than the %d-byte header", what, len,
                    MGE_CKPT_HEADER_SIZE);
    if (memcmp(buf, MGE_CKPT_MAGIC, 8) != 0)
        return fail(MGE_CORRUPT, err, errlen, "%s: not an mge checkpoint (bad magic)", what);
    if (get_le(buf + 20, 4) != 0)
        return fail(MGE_CORRUPT, err, errlen, "%s: reserved header bytes are not zero", what);
    plen = get_le(buf + 8, 8);
    want = (uint32_t)get_le(buf + 16, 4);
    if (plen > len - MGE_CKPT_HEADER_SIZE)
        return fail(MGE_CORRUPT, err, errlen,
                    "%s: truncated: header says %llu payload bytes, file has %zu", what,
                    (unsigned long long)plen, len - MGE_CKPT_HEADER_SIZE);
    if (plen < len - MGE_CKPT_HEADER_SIZE)
        return fail(MGE_CORRUPT, err, errlen,
                    "%s: %zu bytes of trailing data after the %llu-byte payload", what,
                    len - MGE_CKPT_HEADER_SIZE - (size_t)plen, (unsigned long long)plen);
    crc = (uint32_t)crc32_z(0, buf + MGE_CKPT_HEADER_SIZE, (size_t)plen);
    if (crc != want)
        return fail(MGE_CORRUPT, err, errlen,
                    "%s: checksum mismatch: header says crc32 %08x, payload has %08x", what, want,
                    crc);
    return decode_payload(what, buf + MGE_CKPT_HEADER_SIZE, (size_t)plen, out, err, errlen);
}

int mge_ckpt_decode(const void *buf, size_t len, struct mge_ckpt **out, char *err, size_t errlen)
{
    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    return decode_image("<buffer>", buf, len, out, err, errlen);
}

int mge_ckpt_decode_payload(const void *buf, size_t len, struct mge_ckpt **out, char *err,
                            size_t errlen)
{
    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    return decode_payload("<payload>", buf, len, out, err, errlen);
}

int mge_ckpt_read(const char *path, struct mge_ckpt **out, char *err, size_t errlen)
{
    struct stat st;
    uint8_t *buf = NULL;
    size_t len, got = 0;
    int fd, rc, e;

    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        e = errno;
        return fail(e == ENOENT ? MGE_NOENT : MGE_IO, err, errlen, "%s: cannot open: %s", path,
                    strerror(e));
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = fail(MGE_IO, err, errlen, "%s: not a regular file", path);
        goto out_close;
    }
    if ((uint64_t)st.st_size > PAYLOAD_MAX + MGE_CKPT_HEADER_SIZE) {
        rc = fail(MGE_TOOBIG, err, errlen, "%s: %lld bytes is too large", path,
                  (long long)st.st_size);
        goto out_close;
    }
    len = (size_t)st.st_size;
    buf = mge_malloc(len);
    if (!buf) {
        rc = fail(MGE_NOMEM, err, errlen, "%s: cannot allocate %zu bytes", path, len);
        goto out_close;
    }
    while (got < len) {
        ssize_t n = read(fd, buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            e = errno;
            rc = fail(MGE_IO, err, errlen, "%s: read error: %s", path, strerror(e));
            goto out_free_buf;
        }
        if (n == 0)
            break; /* shrank under us: the header check reports it as truncated */
        got += (size_t)n;
    }
    rc = decode_image(path, buf, got, out, err, errlen);
out_free_buf:
    mge_free(buf);
out_close:
    close(fd);
    return rc;
}

const struct mge_ckpt_tensor *mge_ckpt_find(const struct mge_ckpt *ck, const char *name)
{
    for (int i = 0; i < ck->n_tensors; i++)
        if (strcmp(ck->tensors[i].name, name) == 0)
            return &ck->tensors[i];
    return NULL;
}

void mge_ckpt_free(struct mge_ckpt *ck)
{
    if (!ck)
        return;
    if (ck->priv)
        free_message(ck->priv);
    mge_free(ck->tensors);
    mge_free(ck);
}
