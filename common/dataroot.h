/*
 * dataroot.h: the directories data files must lie under (a worker's --data-root), and the one
 * way to open a data file so that the check holds for the file that was actually opened.
 *
 * Why check the opened descriptor, not the path: a path checked with realpath() and opened
 * later can point elsewhere by then (a symlink inside a root flipped to a file outside it).
 * mge_data_open() opens first and then asks the kernel where that descriptor's file lies
 * (/proc/self/fd/N), so no change of the path after the open can move the file it reads.
 * A FIFO cannot hang the open (O_NONBLOCK) and is refused by fstat() right after it.
 *
 * The worker hands its roots to the ranks it starts in MGE_DATA_ROOTS ("DIR:DIR:..."), which
 * mge-train enforces at every open; without that variable mge-train reads any path (a laptop).
 */
#ifndef MGE_COMMON_DATAROOT_H
#define MGE_COMMON_DATAROOT_H

#include <stdbool.h>
#include <stddef.h>

#define MGE_DATA_ROOTS_MAX 32
#define MGE_DATA_ROOTS_ENV "MGE_DATA_ROOTS"

struct mge_data_roots {
    char *dir[MGE_DATA_ROOTS_MAX]; /* owned; real paths (realpath) without a trailing '/' */
    int n;
};

/*
 * Add directory @dir (resolved with realpath) to @dr. Returns MGE_OK, MGE_NOENT (does not
 * exist), MGE_INVAL (not a directory, or a ':' in its real path, which MGE_DATA_ROOTS cannot
 * carry), MGE_TOOBIG (more than MGE_DATA_ROOTS_MAX) or MGE_NOMEM, with a message in @err.
 */
int mge_data_roots_add(struct mge_data_roots *dr, const char *dir, char *err, size_t errlen);

/* Add every directory of @list ("DIR:DIR:...", "" for none); errors as mge_data_roots_add(). */
int mge_data_roots_parse(struct mge_data_roots *dr, const char *list, char *err, size_t errlen);

/* "DIR:DIR:..." as a new string the caller frees with mge_free(); NULL on OOM. */
char *mge_data_roots_join(const struct mge_data_roots *dr);

/* Free the directories and zero @dr; a zeroed @dr is fine. */
void mge_data_roots_fini(struct mge_data_roots *dr);

/* Whether real path @real is one of the roots or lies under one. */
bool mge_data_roots_contain(const struct mge_data_roots *dr, const char *real);

/*
 * Open data file @path for reading (O_RDONLY | O_CLOEXEC | O_NOCTTY, blocking reads), refusing
 * anything but a regular file and, when @dr is not NULL, a file whose real path (that of the
 * opened descriptor) lies outside every root of @dr. On MGE_OK *@fd_out is the caller's to
 * close. Errors: MGE_NOENT (no such file), MGE_IO (cannot open: errno's text; or not a
 * regular file: says which kind), MGE_FORBIDDEN (outside the roots: "data path '...' is outside
 * the worker's data roots (--data-root)"), MGE_STATE (the file was moved or deleted while it
 * was opened). The message in @err (not NULL) names @path and never anything read from the
 * file. Thread: any.
 */
int mge_data_open(const struct mge_data_roots *dr, const char *path, int *fd_out, char *err,
                  size_t errlen);

#endif
