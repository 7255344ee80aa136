/*
 * store_file.c: the coordinator's database as a file: its integrity before SQLite replays it
 * (the WAL's frames) and after (PRAGMA quick_check), and --restore-from (see store.h). The
 * connection-level half (open, the open marker, migrations, close) is in store.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "store.h"
#include "store_int.h"

int mge__store_err_from_sqlite(int rc)
{
    switch (rc & 0xff) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
        return MGE_CORRUPT;
    case SQLITE_NOMEM:
        return MGE_NOMEM;
    default:
        return MGE_DB;
    }
}

int mge__store_dir_path(char *buf, size_t n, const char *dir, const char *name)
{
    int k = snprintf(buf, n, "%s/%s", dir, name);
    if (k < 0 || (size_t)k >= n)
        return MGE_ERR(MGE_RANGE, "state directory path '%s' is too long", dir);
    return MGE_OK;
}

int mge__store_dir_sync(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC), rc = MGE_OK;
    if (fd < 0 || fsync(fd) != 0)
        rc = MGE_ERR(MGE_IO, "cannot sync directory '%s': %s", dir, strerror(errno));
    if (fd >= 0)
        close(fd);
    return rc;
}

int mge__store_quick_check(sqlite3 *db, char *why, size_t n)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db, "PRAGMA quick_check(1)", -1, &s, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        const char *r = (const char *)sqlite3_column_text(s, 0);
        rc = r && !strcmp(r, "ok") ? MGE_OK : MGE_CORRUPT;
        snprintf(why, n, "%s", r ? r : "no result");
    } else {
        snprintf(why, n, "%s", sqlite3_errmsg(db));
        rc = mge__store_err_from_sqlite(rc);
    }
    sqlite3_finalize(s);
    return rc;
}

/* Whether table @name exists in @db (false also when the schema cannot be read). */
static bool db_has_table(sqlite3 *db, const char *name)
{
    sqlite3_stmt *s = NULL;
    bool found = false;
    if (sqlite3_prepare_v2(db, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", -1,
                           &s, NULL) == SQLITE_OK) {
        sqlite3_bind_text(s, 1, name, -1, SQLITE_STATIC);
        found = sqlite3_step(s) == SQLITE_ROW;
    }
    sqlite3_finalize(s);
    return found;
}

/* A 32-bit word of a WAL file: big-endian, or in the byte order its magic says for checksums. */
static uint32_t wal_word(const unsigned char *p, bool big)
{
    return big ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]
               : (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

/* SQLite's WAL checksum of @n bytes (a multiple of 8) at @p, continuing from @s. */
static void wal_cksum(const unsigned char *p, size_t n, bool big, uint32_t s[2])
{
    for (size_t i = 0; i + 8 <= n; i += 8) {
        s[0] += wal_word(p + i, big) + s[1];
        s[1] += wal_word(p + i + 4, big) + s[0];
    }
}

/*
 * Check the write-ahead log @wal before SQLite opens it. SQLite replays a WAL up to its first
 * frame that fails its checksum and drops the rest without a word (all of it when the header
 * fails): commits lost, ids reused. A crash can tear only the last write, so a bad frame with
 * a later frame of the same generation (salts) that checks out against its predecessor, or a
 * bad header in front of frames, is damage; a bad frame at the end is a torn write and fine.
 * MGE_OK, or MGE_CORRUPT with what is wrong in @why (@n bytes). See sqlite.org/walformat.html.
 */
int mge__store_wal_check(const char *wal, char *why, size_t n)
{
    FILE *f = fopen(wal, "rb");
    unsigned char hdr[32], fh[24], *page = NULL;
    uint32_t s[2] = {0, 0}, magic, psize, salt[2];
    long frame = 0, bad = -1;
    bool big;
    int rc = MGE_OK;

    if (!f)
        return MGE_OK; /* none: nothing to replay */
    if (fread(hdr, 1, sizeof(hdr), f) != sizeof(hdr))
        goto out_close; /* empty (checkpointed and truncated) or torn at creation */
    magic = wal_word(hdr, true);
    psize = wal_word(hdr + 8, true);
    big = magic == 0x377f0683;
    if ((magic & 0xfffffffe) != 0x377f0682 || psize < 512 || psize > 65536 ||
        (psize & (psize - 1)) != 0) {
        snprintf(why, n, "its header is not a WAL header");
        rc = MGE_CORRUPT;
        goto out_close;
    }
    wal_cksum(hdr, 24, big, s);
    salt[0] = wal_word(hdr + 16, true);
    salt[1] = wal_word(hdr + 20, true);
    page = mge_malloc(psize);
    if (!page) {
        rc = MGE_NOMEM;
        goto out_close;
    }
    if (s[0] != wal_word(hdr + 24, true) || s[1] != wal_word(hdr + 28, true)) {
        if (fread(fh, 1, sizeof(fh), f) == sizeof(fh)) {
            snprintf(why, n, "its header fails its checksum, with frames behind it");
            rc = MGE_CORRUPT;
        }
        goto out_free;
    }
    while (fread(fh, 1, sizeof(fh), f) == sizeof(fh) && fread(page, 1, psize, f) == psize) {
        uint32_t c[2] = {s[0], s[1]};
        bool ours = wal_word(fh + 8, true) == salt[0] && wal_word(fh + 12, true) == salt[1];
        frame++;
        if (!ours)
            break; /* a frame of an earlier generation: where SQLite stops, legitimately */
        wal_cksum(fh, 8, big, c);
        wal_cksum(page, psize, big, c);
        if (c[0] == wal_word(fh + 16, true) && c[1] == wal_word(fh + 20, true)) {
            if (bad >= 0) { /* written after the bad frame: the bad one is damage, not a tear */
                snprintf(why, n, "frame %ld fails its checksum and frames behind it do not", bad);
                rc = MGE_CORRUPT;
                break;
            }
        } else if (bad < 0) {
            bad = frame;
        }
        /* the next frame's checksum continues from this one's stored value */
        s[0] = wal_word(fh + 16, true);
        s[1] = wal_word(fh + 20, true);
    }
out_free:
    mge_free(page);
out_close:
    fclose(f);
    return rc;
}

/* Copy the AUTOINCREMENT counters of @from into @to where they are higher (ids never reused). */
static void db_keep_sequences(sqlite3 *from, sqlite3 *to)
{
    sqlite3_stmt *r = NULL, *w = NULL;
    if (sqlite3_prepare_v2(from, "SELECT name, seq FROM sqlite_sequence", -1, &r, NULL) !=
            SQLITE_OK ||
        sqlite3_prepare_v2(to, "UPDATE sqlite_sequence SET seq = MAX(seq, ?2) WHERE name = ?1", -1,
                           &w, NULL) != SQLITE_OK) {
        mge_log_warn("store: cannot read the ids the replaced database handed out (%s): ids "
                     "issued after the backup may be issued again",
                     sqlite3_errmsg(r ? to : from));
        goto out_finalize;
    }
    while (sqlite3_step(r) == SQLITE_ROW) {
        sqlite3_bind_value(w, 1, sqlite3_column_value(r, 0));
        sqlite3_bind_int64(w, 2, sqlite3_column_int64(r, 1));
        if (sqlite3_step(w) != SQLITE_DONE)
            mge_log_warn("store: cannot keep the id counter of '%s': %s",
                         (const char *)sqlite3_column_text(r, 0), sqlite3_errmsg(to));
        sqlite3_reset(w);
    }
out_finalize:
    sqlite3_finalize(r);
    sqlite3_finalize(w);
}

/* Copy @backup (checked) to @tmp, without the open marker. */
static int db_copy_backup(const char *backup, const char *tmp)
{
    sqlite3 *src = NULL, *dst = NULL;
    sqlite3_backup *b;
    char why[256];
    int rc;

    if (sqlite3_open_v2(backup, &src, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        rc = MGE_ERR(MGE_IO, "cannot open backup '%s': %s", backup, sqlite3_errmsg(src));
        goto out_close;
    }
    rc = mge__store_quick_check(src, why, sizeof(why));
    if (rc != MGE_OK) {
        MGE_ERR(rc, "backup '%s' is not usable (%s): choose another one", backup, why);
        goto out_close;
    }
    unlink(tmp);
    if (sqlite3_open_v2(tmp, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK) {
        rc = MGE_ERR(MGE_IO, "cannot create '%s': %s", tmp, sqlite3_errmsg(dst));
        goto out_close;
    }
    b = sqlite3_backup_init(dst, "main", src, "main");
    if (!b || sqlite3_backup_step(b, -1) != SQLITE_DONE) {
        rc = MGE_ERR(MGE_DB, "cannot copy backup '%s': %s", backup, sqlite3_errmsg(dst));
        sqlite3_backup_finish(b);
        goto out_close;
    }
    if (sqlite3_backup_finish(b) != SQLITE_OK ||
        (db_has_table(dst, "meta") &&
         sqlite3_exec(dst, MGE__STORE_SQL_MARKER_CLEAR, NULL, NULL, NULL) != SQLITE_OK)) {
        rc = MGE_ERR(MGE_DB, "cannot copy backup '%s': %s", backup, sqlite3_errmsg(dst));
        goto out_close;
    }
out_close:
    if (dst && sqlite3_close(dst) != SQLITE_OK && rc == MGE_OK)
        rc = MGE_ERR(MGE_DB, "cannot close '%s'", tmp);
    sqlite3_close(src);
    if (rc != MGE_OK)
        unlink(tmp);
    return rc;
}

int mge_store_restore(const char *dir, const char *backup)
{
    char path[4096], tmp[4200], aside[4200], from[4300];
    static const char *const sides[] = {"", "-wal", "-shm"};
    struct stat sb;
    int rc;

    if (mkdir(dir, 0700) != 0 && (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        return MGE_ERR(MGE_IO, "cannot create state directory '%s'", dir);
    rc = mge__store_dir_path(path, sizeof(path), dir, "mge.db");
    if (rc != MGE_OK)
        return rc;
    snprintf(tmp, sizeof(tmp), "%s.restoring", path);
    snprintf(aside, sizeof(aside), "%s.replaced-%lld", path, (long long)(mge_now_ms() / 1000));
    rc = db_copy_backup(backup, tmp);
    if (rc != MGE_OK)
        return rc;
    if (stat(path, &sb) == 0) {
        sqlite3 *old = NULL, *dst = NULL;
        /* the ids the replaced file handed out are not handed out again */
        if (sqlite3_open_v2(path, &old, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
            sqlite3_open_v2(tmp, &dst, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK)
            db_keep_sequences(old, dst);
        sqlite3_close(old);
        sqlite3_close(dst);
        for (size_t i = 0; i < sizeof(sides) / sizeof(sides[0]); i++) {
            char to[4400];
            snprintf(from, sizeof(from), "%s%s", path, sides[i]);
            snprintf(to, sizeof(to), "%s%s", aside, sides[i]);
            if (!strcmp(sides[i], "-shm"))
                unlink(from); /* an index of the WAL moved aside: rebuilt from the file */
            else if (rename(from, to) != 0 && errno != ENOENT) {
                rc = MGE_ERR(MGE_IO, "cannot move '%s' aside: %s", from, strerror(errno));
                unlink(tmp);
                return rc;
            }
        }
    }
    if (rename(tmp, path) != 0) {
        rc = MGE_ERR(MGE_IO, "cannot put the restored database in place: %s", strerror(errno));
        unlink(tmp);
        return rc;
    }
    rc = mge__store_dir_sync(dir);
    if (rc == MGE_OK)
        mge_log_warn("store: restored '%s' from '%s'; the replaced file (if any) is kept as '%s'",
                     path, backup, aside);
    return rc;
}
