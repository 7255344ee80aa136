/*
 * ckpt_path.h: which checkpoint paths the coordinator believes and serves. A worker reports a
 * checkpoint as "NAME STEP SIZE PATH" (worker/ranks.c, ckpt_scan), where PATH is
 * WORK_DIR/job-J/attempt-A/rank-R/NAME (the rank's output dir, worker/ranks.c spawn_rank) and
 * NAME is what mge-train writes, "ckpt-<step>.mgeckpt". Only such paths of the line's own job,
 * attempt and rank are stored, and a file is served only when it is a plain file reached
 * without following a symlink below WORK_DIR (WORK_DIR itself is the operator's, so a symlink
 * in it is fine).
 * Thread: any (no state).
 */
#ifndef MGE_COORDINATOR_CKPT_PATH_H
#define MGE_COORDINATOR_CKPT_PATH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether @name is "ckpt-<1 to 18 digits>.mgeckpt"; the number into *@step (if not NULL). */
bool mge_ckpt_name_ok(const char *name, int64_t *step);

/*
 * Whether @path may be stored as checkpoint @name of job @job_id, reported for @attempt and
 * @rank: @name is "ckpt-<digits>.mgeckpt", @path is absolute, has no "." or ".." component
 * nor an empty one, and ends with "/job-<job_id>/attempt-<attempt>/rank-<rank>/<name>". When
 * the file is visible from this host it must also open with mge_ckpt_path_open(). On false,
 * @why (of @why_len bytes) says what is wrong.
 */
bool mge_ckpt_path_ok(int64_t job_id, int attempt, int rank, const char *name, const char *path,
                      char *why, size_t why_len);

/*
 * Open checkpoint @path of job @job_id for reading: @path must pass the checks above (for any
 * attempt and rank); the directories job-J, attempt-A, rank-R and the file are opened one by
 * one below WORK_DIR with O_NOFOLLOW, and the file must be a regular file with one link (a
 * hard link could name a file elsewhere). Returns the descriptor (caller closes), or -1 with
 * errno set: ENOENT (not here), ELOOP (a symlink on the way), EINVAL (not a checkpoint path, not
 * a regular file, more than one link), or what open() said.
 */
int mge_ckpt_path_open(int64_t job_id, const char *path);

#endif
