/* ckpt_path.c: checkpoint paths the coordinator believes and serves (see ckpt_path.h). */
#include "ckpt_path.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CKPT_PATH_MAX 4096

bool mge_ckpt_name_ok(const char *name, int64_t *step)
{
    const char *p = name;
    size_t digits = 0;
    int64_t v = 0;
    if (strncmp(p, "ckpt-", 5) != 0)
        return false;
    for (p += 5; *p >= '0' && *p <= '9'; p++) {
        digits++;
        v = digits <= 18 ? v * 10 + (*p - '0') : v;
    }
    if (step)
        *step = v;
    return digits > 0 && digits <= 18 && !strcmp(p, ".mgeckpt");
}

static bool name_ok(const char *name)
{
    return mge_ckpt_name_ok(name, NULL);
}

/* @s is "<prefix><decimal>" with no sign or leading zero (unless "0"); its value into @v. */
static bool number_after(const char *s, size_t len, const char *prefix, long long *v)
{
    size_t pl = strlen(prefix), i;
    long long x = 0;
    if (len <= pl || len - pl > 18 || strncmp(s, prefix, pl) != 0 || (s[pl] == '0' && len - pl > 1))
        return false;
    for (i = pl; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        x = x * 10 + (s[i] - '0');
    }
    *v = x;
    return true;
}

/*
 * The lexical checks of mge_ckpt_path_ok; the components into @comp (offsets and lengths of
 * the last four) and the work dir's length into @prefix_len. Attempt and rank into @attempt,
 * @rank. On false, @why says what is wrong.
 */
static bool path_parse(int64_t job_id, const char *path, size_t comp_off[4], size_t comp_len[4],
                       long long *attempt, long long *rank, char *why, size_t why_len)
{
    size_t n = strlen(path), starts[4] = {0}, lens[4] = {0}, seen = 0;
    long long job = -1;
    const char *p = path;
    if (n == 0 || n >= CKPT_PATH_MAX || path[0] != '/') {
        snprintf(why, why_len, "not an absolute path");
        return false;
    }
    /* walk the components; remember the last four */
    while (*p) {
        const char *c = ++p, *e = strchr(c, '/');
        size_t len = e ? (size_t)(e - c) : strlen(c);
        if (len == 0 || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.')) {
            snprintf(why, why_len, "empty, '.' or '..' component");
            return false;
        }
        memmove(starts, starts + 1, 3 * sizeof(*starts));
        memmove(lens, lens + 1, 3 * sizeof(*lens));
        starts[3] = (size_t)(c - path);
        lens[3] = len;
        seen++;
        p = c + len;
    }
    if (seen < 5) {
        snprintf(why, why_len, "too short for WORK_DIR/job-J/attempt-A/rank-R/NAME");
        return false;
    }
    if (!number_after(path + starts[0], lens[0], "job-", &job) || job != job_id ||
        !number_after(path + starts[1], lens[1], "attempt-", attempt) || *attempt < 1 ||
        !number_after(path + starts[2], lens[2], "rank-", rank)) {
        snprintf(why, why_len, "not in job %lld's output directories (job-%lld/attempt-A/rank-R)",
                 (long long)job_id, (long long)job_id);
        return false;
    }
    memcpy(comp_off, starts, sizeof(starts));
    memcpy(comp_len, lens, sizeof(lens));
    return true;
}

int mge_ckpt_path_open(int64_t job_id, const char *path)
{
    size_t off[4], len[4];
    long long attempt, rank;
    char why[128], buf[CKPT_PATH_MAX];
    struct stat sb;
    int dfd, fd, err;

    if (!path_parse(job_id, path, off, len, &attempt, &rank, why, sizeof(why)) ||
        !name_ok(path + off[3])) {
        errno = EINVAL;
        return -1;
    }
    memcpy(buf, path, off[0]);
    buf[off[0]] = '\0'; /* WORK_DIR with its trailing '/': the operator's, symlinks allowed */
    dfd = open(buf, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    for (int i = 0; i < 4 && dfd >= 0; i++) {
        memcpy(buf, path + off[i], len[i]);
        buf[len[i]] = '\0';
        fd = openat(dfd, buf,
                    O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | (i < 3 ? O_DIRECTORY : 0));
        err = errno;
        close(dfd);
        errno = err;
        dfd = fd;
    }
    if (dfd < 0) {
        if (errno == ENOTDIR) /* O_DIRECTORY|O_NOFOLLOW on a symlink says ENOTDIR */
            errno = ELOOP;
        return -1;
    }
    if (fstat(dfd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_nlink != 1) {
        close(dfd);
        errno = EINVAL;
        return -1;
    }
    return dfd;
}

bool mge_ckpt_path_ok(int64_t job_id, int attempt, int rank, const char *name, const char *path,
                      char *why, size_t why_len)
{
    size_t off[4], len[4];
    long long a, r;
    int fd;
    if (!name_ok(name)) {
        snprintf(why, why_len, "'%.80s' is not a checkpoint file name (ckpt-STEP.mgeckpt)", name);
        return false;
    }
    if (!path_parse(job_id, path, off, len, &a, &r, why, why_len))
        return false;
    if (a != attempt || r != rank) {
        snprintf(why, why_len, "reported for attempt %d rank %d but names attempt %lld rank %lld",
                 attempt, rank, a, r);
        return false;
    }
    if (strcmp(path + off[3], name) != 0) {
        snprintf(why, why_len, "the path does not end in its name '%.80s'", name);
        return false;
    }
    fd = mge_ckpt_path_open(job_id, path);
    if (fd >= 0) {
        close(fd);
        return true;
    }
    if (errno == ENOENT) /* on a worker this host cannot see: believed by its name alone */
        return true;
    snprintf(why, why_len, "%s",
             errno == ELOOP    ? "a symbolic link on the way"
             : errno == EINVAL ? "not a plain file with one link"
                               : strerror(errno));
    return false;
}
