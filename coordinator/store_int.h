/* store_int.h: what store.c and store_file.c share (the store's internals, not its contract). */
#ifndef MGE_COORDINATOR_STORE_INT_H
#define MGE_COORDINATOR_STORE_INT_H

#include <sqlite3.h>
#include <stddef.h>

/*
 * What an operator does after a refusal because the database is damaged or incomplete; the
 * steps are in docs/operations.md ("Backup and restore").
 */
#define MGE__STORE_RESTORE_HINT                                                                    \
    "restore the latest backup: start the coordinator once with --restore-from BACKUP-FILE "       \
    "(docs/operations.md, \"Backup and restore\")"

/* Clears the "open" marker (see db_mark_open in store.c); a restored copy must not carry one. */
#define MGE__STORE_SQL_MARKER_CLEAR "DELETE FROM meta WHERE key = 'open'"

/* Our code for SQLite result @rc: a damaged file is MGE_CORRUPT, memory MGE_NOMEM, else MGE_DB. */
int mge__store_err_from_sqlite(int rc);

/* "@dir/@name" into @buf (@n bytes); MGE_RANGE (logged) if it does not fit. */
int mge__store_dir_path(char *buf, size_t n, const char *dir, const char *name);

/* fsync directory @dir, so that a file created or renamed in it survives an OS crash. */
int mge__store_dir_sync(const char *dir);

/*
 * PRAGMA quick_check of @db: MGE_OK, or MGE_CORRUPT (or the error that stopped the check)
 * with SQLite's first complaint in @why (@n bytes). Logs nothing: the caller says what it means.
 */
int mge__store_quick_check(sqlite3 *db, char *why, size_t n);

/*
 * Check the write-ahead log @wal before SQLite opens it (SQLite replays a WAL up to its first
 * bad frame and drops the rest without a word). MGE_OK (also when there is none), MGE_NOMEM,
 * or MGE_CORRUPT with what is wrong in @why (@n bytes); logs nothing.
 */
int mge__store_wal_check(const char *wal, char *why, size_t n);

#endif
