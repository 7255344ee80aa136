/* store.c: the coordinator's SQLite store (see store.h): schema migrations, cached statements. */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "ckpt_path.h"
#include "store_int.h"

#define LOGS_PER_JOB_MAX 50000 /* log lines kept per job; older ones are pruned */

/* Versioned migrations: schema version N is reached by applying migrations[0..N-1]. */
static const char *const migrations[] = {
    /* 1: initial schema */
    "CREATE TABLE jobs("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, state INTEGER NOT NULL,"
    " priority INTEGER NOT NULL, attempt INTEGER NOT NULL DEFAULT 1,"
    " max_attempts INTEGER NOT NULL DEFAULT 3, workers_min INTEGER NOT NULL,"
    " workers_max INTEGER NOT NULL, cpus INTEGER NOT NULL, gpus INTEGER NOT NULL,"
    " memory_mb INTEGER NOT NULL, device INTEGER NOT NULL, total_steps INTEGER NOT NULL,"
    " spec_yaml TEXT NOT NULL, spec_json TEXT NOT NULL, created_ms INTEGER NOT NULL,"
    " started_ms INTEGER, finished_ms INTEGER, failure_reason TEXT, result TEXT);"
    "CREATE INDEX jobs_by_state ON jobs(state, id);"
    "CREATE INDEX jobs_queue ON jobs(state, priority DESC, id);"
    "CREATE TABLE events("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL, kind TEXT NOT NULL,"
    " attempt INTEGER, rank INTEGER, seq INTEGER, stream INTEGER, data TEXT NOT NULL,"
    " time_ms INTEGER NOT NULL, UNIQUE(job_id, attempt, rank, seq));"
    "CREATE INDEX events_by_job ON events(job_id, kind, id);"
    "CREATE TABLE metrics("
    " job_id INTEGER NOT NULL, name TEXT NOT NULL, step INTEGER NOT NULL, value REAL NOT NULL,"
    " time_ms INTEGER NOT NULL, PRIMARY KEY(job_id, name, step)) WITHOUT ROWID;"
    "CREATE TABLE placements("
    " job_id INTEGER NOT NULL, attempt INTEGER NOT NULL, rank INTEGER NOT NULL,"
    " worker_id TEXT NOT NULL, exited INTEGER NOT NULL DEFAULT 0, exit_code INTEGER,"
    " term_signal INTEGER, PRIMARY KEY(job_id, attempt, rank));"
    "CREATE TABLE workers("
    " id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, host TEXT NOT NULL, cpus INTEGER NOT NULL,"
    " gpus INTEGER NOT NULL, memory_mb INTEGER NOT NULL, device TEXT NOT NULL,"
    " version TEXT NOT NULL, state TEXT NOT NULL, registered_ms INTEGER NOT NULL);"
    "CREATE TABLE checkpoints("
    " job_id INTEGER NOT NULL, name TEXT NOT NULL, step INTEGER NOT NULL, size INTEGER NOT NULL,"
    " path TEXT NOT NULL, worker_id TEXT NOT NULL, time_ms INTEGER NOT NULL,"
    " PRIMARY KEY(job_id, name));",
    /* 2: where mge-launch reaches a worker (multi-worker jobs) */
    "ALTER TABLE workers ADD COLUMN launch_url TEXT NOT NULL DEFAULT '';",
    /* 3: facts about the database itself: the open marker (see db_mark_open) */
    "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);",
    /* 4: elastic jobs: incarnations (one per attempt: size, start step, how it ended) and the
     * restarts charged to the job itself (infrastructure requeues are not) */
    "ALTER TABLE jobs ADD COLUMN restarts INTEGER NOT NULL DEFAULT 0;"
    "CREATE TABLE incarnations("
    " job_id INTEGER NOT NULL, attempt INTEGER NOT NULL, world INTEGER NOT NULL,"
    " start_step INTEGER NOT NULL, started_ms INTEGER NOT NULL, ended_ms INTEGER, ended TEXT,"
    " reason TEXT, infra INTEGER NOT NULL DEFAULT 0, PRIMARY KEY(job_id, attempt));",
    /* 5: checkpoints committed to the coordinator's own store: the copy's path */
    "ALTER TABLE checkpoints ADD COLUMN copy TEXT;",
    /* 6: the memory plan a job is placed by (JSON, see mge_store_job_insert_planned) */
    "ALTER TABLE jobs ADD COLUMN plan TEXT;",
    /* 7: GPU workers: each GPU's name and memory ("MIB NAME" per line), the GPU indexes a rank
     * holds ("0,1"), and the memory a GPU job needs of each GPU (its planned peak) */
    "ALTER TABLE workers ADD COLUMN gpu_list TEXT NOT NULL DEFAULT '';"
    "ALTER TABLE placements ADD COLUMN gpu_ids TEXT NOT NULL DEFAULT '';"
    "ALTER TABLE jobs ADD COLUMN gpu_memory_mb INTEGER NOT NULL DEFAULT 0;",
};

enum sql_id {
    Q_JOB_INSERT,
    Q_EVENT_STATE,
    Q_JOB_GET,
    Q_JOB_ROW,
    Q_JOB_SPEC,
    Q_JOB_LIST,
    Q_JOB_LIST_STATE,
    Q_JOBS_QUEUED,
    Q_PLACEMENTS_ACTIVE,
    Q_JOB_STATE_GET,
    Q_JOB_STATE_SET,
    Q_JOB_REQUEUE,
    Q_PLACE_INSERT,
    Q_PLACE_EXIT,
    Q_PLACE_LIST,
    Q_LINE_INSERT,
    Q_METRIC_UPSERT,
    Q_METRIC_MAXSTEP,
    Q_JOB_RESULT,
    Q_CKPT_UPSERT,
    Q_LINE_FENCE,
    Q_LOG_COUNT,
    Q_LOG_PRUNE,
    Q_EVENTS,
    Q_EVENTS_LAST,
    Q_LOGS_ALL,
    Q_LOGS_RANK,
    Q_METRICS_ALL,
    Q_METRICS_NAME,
    Q_METRICS_LATEST,
    Q_CKPT_LIST,
    Q_CKPT_PATH,
    Q_CKPT_LATEST,
    Q_JOB_COUNTS,
    Q_WORKER_BY_NAME,
    Q_WORKER_INSERT,
    Q_WORKER_UPDATE,
    Q_WORKER_STATE,
    Q_WORKERS_ALL,
    Q_INC_INSERT,
    Q_INC_RESIZED,
    Q_INC_END,
    Q_INC_LIST,
    Q_CKPT_COMMIT,
    Q_CKPT_COPY_LATEST,
    Q_CKPT_COPY_PATH,
    Q_CKPT_COPY_OLD,
    Q_CKPT_COPY_DROP,
    Q_INC_START,
    Q_BEGIN,
    Q_COMMIT,
    Q_ROLLBACK,
    Q__COUNT
};

static const char *const sql_text[Q__COUNT] = {
    [Q_JOB_INSERT] = "INSERT INTO jobs(name, state, priority, workers_min, workers_max, cpus, gpus,"
                     " memory_mb, device, total_steps, spec_yaml, spec_json, created_ms, plan,"
                     " gpu_memory_mb) VALUES(?,0,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    [Q_EVENT_STATE] = "INSERT INTO events(job_id, kind, data, time_ms) VALUES(?, 'state', ?, ?)",
    [Q_JOB_GET] = "SELECT id, name, state, priority, attempt, spec_json, created_ms, started_ms,"
                  " finished_ms, failure_reason, result, total_steps, restarts, plan FROM jobs"
                  " WHERE id = ?",
    [Q_JOB_ROW] = "SELECT id, state, priority, attempt, workers_min, workers_max, cpus, gpus,"
                  " memory_mb, device, total_steps, gpu_memory_mb FROM jobs WHERE id = ?",
    [Q_JOB_SPEC] = "SELECT spec_yaml FROM jobs WHERE id = ?",
    [Q_JOB_LIST] = "SELECT id, name, state, priority, attempt, created_ms, finished_ms,"
                   " failure_reason FROM jobs WHERE id < ? ORDER BY id DESC LIMIT ?",
    [Q_JOB_LIST_STATE] = "SELECT id, name, state, priority, attempt, created_ms, finished_ms,"
                         " failure_reason FROM jobs WHERE state = ? AND id < ?"
                         " ORDER BY id DESC LIMIT ?",
    [Q_JOBS_QUEUED] = "SELECT id, state, priority, attempt, workers_min, workers_max, cpus, gpus,"
                      " memory_mb, device, total_steps, gpu_memory_mb FROM jobs WHERE state = 0"
                      " ORDER BY priority DESC, id ASC LIMIT ?",
    /* the current attempt of running jobs, and the ranks of the attempt before the current one
     * of a job not ended yet that are not known to have ended (superseded: sched.c fences them
     * and counts their slots until they do) */
    [Q_PLACEMENTS_ACTIVE] = "SELECT p.job_id, p.attempt, p.rank, p.worker_id, p.exited,"
                            " p.exit_code, p.term_signal, p.attempt < j.attempt, p.gpu_ids"
                            " FROM placements p"
                            " JOIN jobs j ON j.id = p.job_id WHERE (j.state = 1 AND p.attempt ="
                            " j.attempt) OR (j.state <= 1 AND p.attempt = j.attempt - 1 AND"
                            " p.exited = 0)",
    [Q_JOB_STATE_GET] = "SELECT state, attempt, max_attempts - 1 - restarts,"
                        " attempt - 1 - restarts FROM jobs WHERE id = ?",
    [Q_JOB_STATE_SET] = "UPDATE jobs SET state = ?1,"
                        " started_ms = CASE WHEN ?1 = 1 THEN ?2 ELSE started_ms END,"
                        " finished_ms = CASE WHEN ?1 >= 2 THEN ?2 ELSE finished_ms END,"
                        " failure_reason = CASE WHEN ?1 = 2 THEN NULL"
                        " ELSE COALESCE(?3, failure_reason) END WHERE id = ?4",
    [Q_JOB_REQUEUE] = "UPDATE jobs SET state = 0, attempt = attempt + 1, failure_reason = ?1,"
                      " started_ms = NULL, restarts = restarts + ?3 WHERE id = ?2",
    [Q_PLACE_INSERT] = "INSERT OR REPLACE INTO placements(job_id, attempt, rank, worker_id,"
                       " gpu_ids) VALUES(?,?,?,?,?)",
    [Q_PLACE_EXIT] = "UPDATE placements SET exited = 1, exit_code = ?, term_signal = ?"
                     " WHERE job_id = ? AND attempt = ? AND rank = ?",
    [Q_PLACE_LIST] = "SELECT p.rank, p.worker_id, w.name, p.exited, p.exit_code, p.term_signal,"
                     " w.host, p.gpu_ids"
                     " FROM placements p LEFT JOIN workers w ON w.id = p.worker_id"
                     " WHERE p.job_id = ? AND p.attempt = ? ORDER BY p.rank",
    [Q_LINE_INSERT] = "INSERT OR IGNORE INTO events(job_id, kind, attempt, rank, seq, stream, data,"
                      " time_ms) VALUES(?,?,?,?,?,?,?,?)",
    [Q_METRIC_UPSERT] = "INSERT INTO metrics(job_id, name, step, value, time_ms) VALUES(?,?,?,?,?)"
                        " ON CONFLICT(job_id, name, step) DO UPDATE SET value = excluded.value,"
                        " time_ms = excluded.time_ms",
    [Q_METRIC_MAXSTEP] = "SELECT MAX(step) FROM metrics WHERE job_id = ? AND name = 'loss'",
    [Q_JOB_RESULT] = "UPDATE jobs SET result = ? WHERE id = ? AND attempt = ? AND state = 1",
    /* a notice leaves the committed copy as it is: only a new upload replaces it */
    [Q_CKPT_UPSERT] = "INSERT INTO checkpoints(job_id, name, step, size, path, worker_id, time_ms)"
                      " VALUES(?,?,?,?,?,?,?) ON CONFLICT(job_id, name) DO UPDATE SET"
                      " step = excluded.step, size = excluded.size, path = excluded.path,"
                      " worker_id = excluded.worker_id, time_ms = excluded.time_ms",
    /* a committed copy: ?5 is the worker path if no notice came before it */
    [Q_CKPT_COMMIT] = "INSERT INTO checkpoints(job_id, name, step, size, path, worker_id, time_ms,"
                      " copy) VALUES(?1,?2,?3,?4,?5,?6,?7,?8) ON CONFLICT(job_id, name) DO UPDATE"
                      " SET copy = excluded.copy, size = excluded.size",
    [Q_CKPT_COPY_LATEST] = "SELECT name FROM checkpoints WHERE job_id = ? AND copy IS NOT NULL"
                           " ORDER BY step DESC LIMIT 1",
    [Q_CKPT_COPY_PATH] = "SELECT copy FROM checkpoints WHERE job_id = ? AND name = ?"
                         " AND copy IS NOT NULL",
    [Q_CKPT_COPY_OLD] = "SELECT copy FROM checkpoints WHERE job_id = ? AND copy IS NOT NULL"
                        " ORDER BY step DESC LIMIT 1 OFFSET ?",
    [Q_CKPT_COPY_DROP] = "UPDATE checkpoints SET copy = NULL WHERE job_id = ? AND copy = ?",
    [Q_INC_START] = "UPDATE incarnations SET start_step = ?3 WHERE job_id = ?1 AND attempt = ?2",
    /* the job's state if (job, attempt, rank) is the current attempt's placement on worker ?4 */
    [Q_LINE_FENCE] = "SELECT j.state FROM jobs j JOIN placements p ON p.job_id = j.id"
                     " AND p.attempt = j.attempt WHERE j.id = ?1 AND j.attempt = ?2"
                     " AND p.rank = ?3 AND p.worker_id = ?4",
    [Q_LOG_COUNT] = "SELECT COUNT(*) FROM events WHERE job_id = ? AND kind = 'log'",
    [Q_LOG_PRUNE] = "DELETE FROM events WHERE job_id = ?1 AND kind = 'log' AND id <="
                    " (SELECT id FROM events WHERE job_id = ?1 AND kind = 'log'"
                    " ORDER BY id DESC LIMIT 1 OFFSET ?2)",
    [Q_EVENTS] = "SELECT id, kind, attempt, rank, stream, data, time_ms FROM events"
                 " WHERE job_id = ? AND id > ? ORDER BY id LIMIT ?",
    [Q_EVENTS_LAST] = "SELECT COALESCE(MAX(id), 0) FROM events WHERE job_id = ?",
    [Q_LOGS_ALL] = "SELECT * FROM (SELECT id, attempt, rank, seq, stream, data, time_ms FROM events"
                   " WHERE job_id = ? AND kind = 'log' ORDER BY id DESC LIMIT ?) ORDER BY id",
    [Q_LOGS_RANK] =
        "SELECT * FROM (SELECT id, attempt, rank, seq, stream, data, time_ms FROM events"
        " WHERE job_id = ? AND kind = 'log' AND rank = ? ORDER BY id DESC LIMIT ?)"
        " ORDER BY id",
    [Q_METRICS_ALL] = "SELECT step, name, value, time_ms FROM metrics WHERE job_id = ?"
                      " AND step > ? ORDER BY name, step",
    [Q_METRICS_NAME] = "SELECT step, name, value, time_ms FROM metrics WHERE job_id = ?"
                       " AND name = ? AND step > ? ORDER BY step",
    [Q_METRICS_LATEST] = "SELECT m.name, m.step, m.value FROM metrics m JOIN"
                         " (SELECT name, MAX(step) AS s FROM metrics WHERE job_id = ?1"
                         " GROUP BY name) l ON l.name = m.name AND l.s = m.step"
                         " WHERE m.job_id = ?1",
    [Q_CKPT_LIST] = "SELECT c.name, c.step, c.size, c.worker_id, w.name, c.time_ms,"
                    " c.copy IS NOT NULL FROM checkpoints c"
                    " LEFT JOIN workers w ON w.id = c.worker_id WHERE c.job_id = ?"
                    " ORDER BY c.step DESC, c.name",
    /* the coordinator's own copy when there is one: it is on this host */
    [Q_CKPT_PATH] = "SELECT COALESCE(copy, path) FROM checkpoints WHERE job_id = ? AND name = ?",
    [Q_CKPT_LATEST] = "SELECT path FROM checkpoints WHERE job_id = ? AND name <> 'latest'"
                      " ORDER BY step DESC LIMIT 1",
    [Q_JOB_COUNTS] = "SELECT state, COUNT(*) FROM jobs GROUP BY state",
    [Q_WORKER_BY_NAME] = "SELECT id FROM workers WHERE name = ?",
    [Q_WORKER_INSERT] =
        "INSERT INTO workers(id, name, host, cpus, gpus, memory_mb, device, version,"
        " state, registered_ms, launch_url, gpu_list) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)",
    [Q_WORKER_UPDATE] = "UPDATE workers SET host = ?, cpus = ?, gpus = ?, memory_mb = ?,"
                        " device = ?, version = ?, state = CASE WHEN state = 'draining'"
                        " THEN state ELSE 'ready' END, registered_ms = ?, launch_url = ?,"
                        " gpu_list = ? WHERE id = ?",
    [Q_WORKER_STATE] = "UPDATE workers SET state = ? WHERE id = ?",
    [Q_WORKERS_ALL] = "SELECT id, name, host, cpus, gpus, memory_mb, device, version, state,"
                      " registered_ms, launch_url, gpu_list FROM workers ORDER BY name",
    /* an incarnation starts from the checkpoint its Assign resumes (sched.c queue_assign) */
    [Q_INC_INSERT] = "INSERT OR REPLACE INTO incarnations(job_id, attempt, world, start_step,"
                     " started_ms) VALUES(?1, ?2, ?3, CASE WHEN ?2 > 1 THEN COALESCE((SELECT"
                     " MAX(step) FROM checkpoints WHERE job_id = ?1 AND name <> 'latest'), 0)"
                     " ELSE 0 END, ?4)",
    [Q_INC_RESIZED] = "UPDATE incarnations SET reason = COALESCE(reason, 'ended') || '; resized '"
                      " || world || ' -> ' || ?3 WHERE job_id = ?1 AND attempt = ?2 - 1"
                      " AND world != ?3",
    /* the reason gets the last step this incarnation's rank 0 reported (its metric lines) */
    [Q_INC_END] = "UPDATE incarnations SET ended_ms = ?3, ended = ?4, infra = ?6, reason = ?5 ||"
                  " COALESCE(' at step ' || (SELECT MAX(json_extract(e.data, '$.step'))"
                  " FROM events e WHERE e.job_id = ?1 AND e.attempt = ?2 AND e.stream = 2"
                  " AND e.rank = 0 AND json_valid(e.data)), '') WHERE job_id = ?1"
                  " AND attempt = ?2 AND ended_ms IS NULL",
    [Q_INC_LIST] = "SELECT i.attempt, i.world, i.start_step, i.started_ms, i.ended_ms, i.ended,"
                   " i.reason, i.infra, (SELECT group_concat(name, ',') FROM (SELECT w.name"
                   " FROM placements p LEFT JOIN workers w ON w.id = p.worker_id"
                   " WHERE p.job_id = i.job_id AND p.attempt = i.attempt ORDER BY p.rank))"
                   " FROM incarnations i WHERE i.job_id = ? ORDER BY i.attempt",
    [Q_BEGIN] = "BEGIN IMMEDIATE",
    [Q_COMMIT] = "COMMIT",
    [Q_ROLLBACK] = "ROLLBACK",
};

struct mge_store {
    sqlite3 *db;
    pthread_mutex_t mu;          /* serialises every use of db and stmts */
    sqlite3_stmt *stmts[Q__COUNT]; /* prepared lazily, kept for the store's life */
    bool marked_open;              /* the open marker is set: a clean close clears it */
    pthread_mutex_t hook_mu;       /* guards on_events*; held while the hook runs */
    void (*on_events)(void *arg, int64_t job_id); /* see mge_store_on_events() */
    void *on_events_arg;
    uint64_t lines_fenced;         /* [mu] lines dropped: not the current placement's, or late */
};

static const char *const state_names[MGE_JOB__NSTATES] = {"queued", "running", "succeeded",
                                                          "failed", "cancelled"};

const char *mge_job_state_name(enum mge_job_state s)
{
    return (int)s >= 0 && s < MGE_JOB__NSTATES ? state_names[s] : NULL;
}

int mge_job_state_parse(const char *name)
{
    for (int i = 0; i < MGE_JOB__NSTATES; i++)
        if (name && !strcmp(name, state_names[i]))
            return i;
    return -1;
}

bool mge_job_state_is_terminal(enum mge_job_state s) { return s >= MGE_JOB_SUCCEEDED; }

int64_t mge_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t mge_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int err_db(struct mge_store *st, const char *what)
{
    int rc = sqlite3_extended_errcode(st->db);
    return MGE_ERR(mge__store_err_from_sqlite(rc), "%s: %s", what, sqlite3_errmsg(st->db));
}

/*
 * Step @s to its next row: MGE_OK with *@row true (a row) or false (no more rows), or the
 * error (logged) when SQLite fails part-way, so that no caller returns a shorter list as if
 * it were the whole one. Lock held.
 */
static int step_row(struct mge_store *st, sqlite3_stmt *s, bool *row)
{
    int rc = sqlite3_step(s);
    *row = rc == SQLITE_ROW;
    if (rc == SQLITE_ROW || rc == SQLITE_DONE)
        return MGE_OK;
    return err_db(st, "cannot read rows");
}

/* Step @s to its one row: MGE_OK, MGE_NOENT when there is none, or the error. Lock held. */
static int step_one(struct mge_store *st, sqlite3_stmt *s)
{
    bool row;
    int rc = step_row(st, s, &row);
    return rc == MGE_OK && !row ? MGE_NOENT : rc;
}

/* A cached, reset statement for @id; NULL (logged) if it cannot be prepared. Lock held. */
static sqlite3_stmt *stmt_get(struct mge_store *st, enum sql_id id)
{
    sqlite3_stmt *s = st->stmts[id];
    if (!s) {
        if (sqlite3_prepare_v3(st->db, sql_text[id], -1, SQLITE_PREPARE_PERSISTENT, &s, NULL) !=
            SQLITE_OK) {
            err_db(st, "cannot prepare statement");
            return NULL;
        }
        st->stmts[id] = s;
    }
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    return s;
}

/* Run a statement that returns no rows. Lock held. */
static int exec_stmt(struct mge_store *st, sqlite3_stmt *s)
{
    int rc = sqlite3_step(s);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE && rc != SQLITE_ROW)
        return err_db(st, "statement failed");
    return MGE_OK;
}

static int tx(struct mge_store *st, enum sql_id id)
{
    sqlite3_stmt *s = stmt_get(st, id);
    return s ? exec_stmt(st, s) : MGE_DB;
}

static void bind_text_or_null(sqlite3_stmt *s, int i, const char *t)
{
    if (t)
        sqlite3_bind_text(s, i, t, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(s, i);
}

/* RFC 3339 UTC time of @ms, or JSON null when @ms is NULL in the row. */
static json_t *json_time(sqlite3_stmt *s, int col)
{
    char buf[80];
    struct tm tm;
    time_t t;
    int64_t ms;
    if (sqlite3_column_type(s, col) == SQLITE_NULL)
        return json_null();
    ms = sqlite3_column_int64(s, col);
    t = (time_t)(ms / 1000);
    gmtime_r(&t, &tm);
    snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(ms % 1000));
    return json_string(buf);
}

static json_t *json_text_or_null(sqlite3_stmt *s, int col)
{
    const unsigned char *t = sqlite3_column_text(s, col);
    return t ? json_string((const char *)t) : json_null();
}

/* The "open" marker: present in the main database file from start to clean shutdown. */
#define SQL_MARKER_GET "SELECT value FROM meta WHERE key = 'open'"

/* Apply the migrations @db lacks. */
static int db_migrate(struct mge_store *st, const char *path)
{
    sqlite3_stmt *s = NULL;
    int version, rc;
    const int last = (int)(sizeof(migrations) / sizeof(migrations[0]));

    if (sqlite3_prepare_v2(st->db, "PRAGMA user_version", -1, &s, NULL) != SQLITE_OK ||
        sqlite3_step(s) != SQLITE_ROW) {
        rc = err_db(st, "cannot read schema version");
        sqlite3_finalize(s);
        return rc;
    }
    version = sqlite3_column_int(s, 0);
    sqlite3_finalize(s);
    if (version > last)
        return MGE_ERR(MGE_DB, "database '%s' has schema %d, newer than this coordinator", path,
                       version);
    for (int v = version; v < last; v++) {
        char pragma[64];
        char *msg = NULL;
        snprintf(pragma, sizeof(pragma), "PRAGMA user_version=%d;", v + 1);
        if (sqlite3_exec(st->db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK ||
            sqlite3_exec(st->db, migrations[v], NULL, NULL, &msg) != SQLITE_OK ||
            sqlite3_exec(st->db, pragma, NULL, NULL, &msg) != SQLITE_OK ||
            sqlite3_exec(st->db, "COMMIT", NULL, NULL, &msg) != SQLITE_OK) {
            rc = MGE_ERR(MGE_DB, "migration %d failed: %s", v + 1, msg ? msg : "?");
            sqlite3_free(msg);
            sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
            return rc;
        }
        mge_log_info("store: migrated schema to version %d", v + 1);
    }
    return MGE_OK;
}

/*
 * Refuse a database whose write-ahead log was removed after an unclean stop, then mark it
 * open. The marker reaches the main file (a full checkpoint) before any job changes, and only
 * a clean close clears it; SQLite deletes the WAL only at a clean close too. So "marked open"
 * with no WAL file before we opened it means the WAL was deleted while it may have held
 * commits (jobs missing, their ids handed out again). A crash (kill -9, OOM, power loss after
 * the directory sync below) leaves the WAL file in place and starts normally.
 */
static int db_mark_open(struct mge_store *st, const char *dir, const char *path, bool had_wal)
{
    sqlite3_stmt *s = NULL;
    char mark[128], when[32];
    time_t now = time(NULL);
    struct tm tm;
    bool row;
    int rc;

    if (sqlite3_prepare_v2(st->db, SQL_MARKER_GET, -1, &s, NULL) != SQLITE_OK)
        return err_db(st, "cannot read the open marker");
    rc = step_row(st, s, &row);
    if (rc == MGE_OK && row && !had_wal)
        rc = MGE_ERR(MGE_CORRUPT,
                     "'%s' was in use by a coordinator that did not stop cleanly (%s) and its "
                     "write-ahead log '%s-wal' is gone: the newest jobs and events may be "
                     "missing and their ids would be handed out again; refusing to start; %s; "
                     "or, if the log was checkpointed by another SQLite program (nothing is "
                     "lost then), accept the file as it is with --restore-from %s",
                     path, (const char *)sqlite3_column_text(s, 0), path, MGE__STORE_RESTORE_HINT,
                     path);
    sqlite3_finalize(s);
    if (rc != MGE_OK)
        return rc;
    gmtime_r(&now, &tm);
    strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
    snprintf(mark, sizeof(mark), "pid %ld, started %s", (long)getpid(), when);
    if (sqlite3_prepare_v2(st->db, "INSERT OR REPLACE INTO meta(key, value) VALUES('open', ?)", -1,
                           &s, NULL) != SQLITE_OK)
        return err_db(st, "cannot mark the database open");
    sqlite3_bind_text(s, 1, mark, -1, SQLITE_TRANSIENT);
    rc = sqlite3_step(s) == SQLITE_DONE ? MGE_OK : err_db(st, "cannot mark the database open");
    sqlite3_finalize(s);
    if (rc == MGE_OK &&
        sqlite3_exec(st->db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL) != SQLITE_OK)
        rc = err_db(st, "cannot checkpoint the open marker");
    if (rc == MGE_OK)
        rc = mge__store_dir_sync(dir); /* the WAL file's name is durable from now on */
    if (rc == MGE_OK)
        st->marked_open = true;
    return rc;
}

int mge_store_open(const char *dir, struct mge_store **out)
{
    char path[4096], wal[4200], why[256];
    struct mge_store *st;
    struct stat sb;
    bool had_wal;
    int rc = MGE_OK;

    *out = NULL;
    if (mkdir(dir, 0700) != 0) {
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return MGE_ERR(MGE_IO, "cannot create state directory '%s'", dir);
    }
    rc = mge__store_dir_path(path, sizeof(path), dir, "mge.db");
    if (rc != MGE_OK)
        return rc;
    snprintf(wal, sizeof(wal), "%s-wal", path);
    had_wal = stat(wal, &sb) == 0; /* before SQLite creates one */
    rc = mge__store_wal_check(wal, why, sizeof(why));
    if (rc == MGE_CORRUPT)
        return MGE_ERR(rc,
                       "write-ahead log '%s' is damaged (%s): the commits in it would be "
                       "dropped without a word; refusing to start; %s",
                       wal, why, MGE__STORE_RESTORE_HINT);
    if (rc != MGE_OK)
        return rc;
    st = mge_calloc(1, sizeof(*st));
    if (!st)
        return MGE_NOMEM;
    pthread_mutex_init(&st->mu, NULL);
    pthread_mutex_init(&st->hook_mu, NULL);
    if (sqlite3_open_v2(path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                                           SQLITE_OPEN_FULLMUTEX, NULL) != SQLITE_OK) {
        rc = MGE_ERR(MGE_DB, "cannot open '%s': %s", path, sqlite3_errmsg(st->db));
        goto err_close;
    }
    sqlite3_busy_timeout(st->db, 5000);
    /* WAL + NORMAL: a commit survives a kill -9 of this process (the WAL is written before
     * COMMIT returns); only an OS crash can lose the last transactions. */
    if (sqlite3_exec(st->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
                             "PRAGMA foreign_keys=OFF;", NULL, NULL, NULL) != SQLITE_OK) {
        rc = err_db(st, "cannot set pragmas");
        if (rc == MGE_CORRUPT)
            MGE_ERR(rc, "'%s' is not a usable database; refusing to start; %s", path,
                    MGE__STORE_RESTORE_HINT);
        goto err_close;
    }
    rc = mge__store_quick_check(st->db, why, sizeof(why));
    if (rc != MGE_OK) {
        MGE_ERR(rc, "'%s' failed its integrity check (%s); refusing to start; %s", path, why,
                MGE__STORE_RESTORE_HINT);
        goto err_close;
    }
    rc = db_migrate(st, path);
    if (rc == MGE_OK)
        rc = db_mark_open(st, dir, path, had_wal);
    if (rc != MGE_OK)
        goto err_close;
    *out = st;
    return MGE_OK;

err_close:
    sqlite3_close(st->db);
    pthread_mutex_destroy(&st->hook_mu);
    pthread_mutex_destroy(&st->mu);
    mge_free(st);
    return rc;
}

void mge_store_close(struct mge_store *st)
{
    if (!st)
        return;
    for (int i = 0; i < Q__COUNT; i++)
        sqlite3_finalize(st->stmts[i]);
    /* a clean stop: the marker goes, and the full checkpoint lets SQLite drop the WAL */
    if (st->marked_open &&
        sqlite3_exec(st->db, MGE__STORE_SQL_MARKER_CLEAR "; PRAGMA wal_checkpoint(TRUNCATE);", NULL,
                     NULL, NULL) != SQLITE_OK)
        err_db(st, "cannot clear the open marker (the next start will check the WAL)");
    sqlite3_close(st->db);
    pthread_mutex_destroy(&st->hook_mu);
    pthread_mutex_destroy(&st->mu);
    mge_free(st);
}

void mge_store_on_events(struct mge_store *st, void (*fn)(void *arg, int64_t job_id), void *arg)
{
    pthread_mutex_lock(&st->hook_mu);
    st->on_events = fn;
    st->on_events_arg = arg;
    pthread_mutex_unlock(&st->hook_mu);
}

/* Tell the events hook that job @job_id has new events. Call with st->mu released. */
static void events_notify(struct mge_store *st, int64_t job_id)
{
    pthread_mutex_lock(&st->hook_mu);
    if (st->on_events)
        st->on_events(st->on_events_arg, job_id);
    pthread_mutex_unlock(&st->hook_mu);
}

/* events_notify() for the jobs of an ingested batch, once per run of lines of one job. */
static void events_notify_lines(struct mge_store *st, const struct mge_store_line *lines, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (i == 0 || lines[i].job_id != lines[i - 1].job_id)
            events_notify(st, lines[i].job_id);
}

/* Append a state event. Lock held. */
static int event_state(struct mge_store *st, int64_t job_id, enum mge_job_state state,
                       int attempt, const char *reason, int64_t now)
{
    json_t *o = json_pack("{s:s, s:i}", "state", mge_job_state_name(state), "attempt", attempt);
    char *txt;
    sqlite3_stmt *s;
    int rc;
    if (!o)
        return MGE_NOMEM;
    if (reason)
        json_object_set_new(o, "reason", json_string(reason));
    txt = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!txt)
        return MGE_NOMEM;
    s = stmt_get(st, Q_EVENT_STATE);
    if (!s) {
        free(txt);
        return MGE_DB;
    }
    sqlite3_bind_int64(s, 1, job_id);
    sqlite3_bind_text(s, 2, txt, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(s, 3, now);
    rc = exec_stmt(st, s);
    free(txt);
    return rc;
}

int mge_store_job_insert(struct mge_store *st, const struct mge_jobspec *spec,
                         const char *spec_json, int64_t total_steps, int64_t *out_id)
{
    return mge_store_job_insert_planned(st, spec, spec_json, total_steps, NULL, 0, out_id);
}

int mge_store_job_insert_planned(struct mge_store *st, const struct mge_jobspec *spec,
                                 const char *spec_json, int64_t total_steps, const char *plan_json,
                                 int64_t plan_mb, int64_t *out_id)
{
    sqlite3_stmt *s;
    int64_t now = mge_now_ms();
    int rc;

    pthread_mutex_lock(&st->mu);
    rc = tx(st, Q_BEGIN);
    if (rc != MGE_OK)
        goto out_unlock;
    s = stmt_get(st, Q_JOB_INSERT);
    if (!s) {
        rc = MGE_DB;
        goto out_rollback;
    }
    sqlite3_bind_text(s, 1, spec->name ? spec->name : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(s, 2, spec->priority);
    sqlite3_bind_int(s, 3, spec->resources.workers_min);
    sqlite3_bind_int(s, 4, spec->resources.workers_max);
    sqlite3_bind_int(s, 5, spec->resources.cpus);
    sqlite3_bind_int(s, 6, spec->resources.gpus);
    /* a GPU job's plan is device memory: each of its GPUs must have that much */
    if (spec->resources.device == MGE_DEVICE_GPU)
        sqlite3_bind_int64(s, 7, spec->resources.memory_mb);
    else
        sqlite3_bind_int64(
            s, 7, plan_mb > spec->resources.memory_mb ? plan_mb : spec->resources.memory_mb);
    sqlite3_bind_int64(s, 14, spec->resources.device == MGE_DEVICE_GPU ? plan_mb : 0);
    sqlite3_bind_int(s, 8, (int)spec->resources.device);
    sqlite3_bind_int64(s, 9, total_steps);
    sqlite3_bind_text(s, 10, spec->source ? spec->source : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 11, spec_json, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(s, 12, now);
    if (plan_json)
        sqlite3_bind_text(s, 13, plan_json, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(s, 13);
    rc = exec_stmt(st, s);
    if (rc != MGE_OK)
        goto out_rollback;
    *out_id = sqlite3_last_insert_rowid(st->db);
    rc = event_state(st, *out_id, MGE_JOB_QUEUED, 1, NULL, now);
    if (rc != MGE_OK)
        goto out_rollback;
    rc = tx(st, Q_COMMIT);
    if (rc == MGE_OK)
        goto out_unlock;
out_rollback:
    tx(st, Q_ROLLBACK);
out_unlock:
    pthread_mutex_unlock(&st->mu);
    if (rc == MGE_OK)
        events_notify(st, *out_id);
    return rc;
}

/* Placement of a job's attempt as a new JSON array in *@out. Lock held. */
/* "0,1" as the JSON array [0, 1] (NULL on OOM; an unreadable list is []). */
static json_t *gpu_ids_json(const char *ids)
{
    json_t *arr = json_array();
    uint64_t mask = 0;
    mge_gpu_mask_parse(ids, &mask);
    for (int i = 0; arr && i < MGE_GPUS_MAX; i++)
        if (mask >> i & 1)
            json_array_append_new(arr, json_integer(i));
    return arr;
}

static int placement_json(struct mge_store *st, int64_t id, int attempt, json_t **out)
{
    json_t *arr = json_array();
    sqlite3_stmt *s = stmt_get(st, Q_PLACE_LIST);
    bool row;
    int rc;
    *out = NULL;
    if (!arr)
        return MGE_NOMEM;
    if (!s) {
        json_decref(arr);
        return MGE_DB;
    }
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_int(s, 2, attempt);
    while ((rc = step_row(st, s, &row)) == MGE_OK && row) {
        json_t *p = json_pack("{s:i, s:o, s:o, s:o, s:b}", "rank", sqlite3_column_int(s, 0),
                              "worker_id", json_text_or_null(s, 1), "worker",
                              json_text_or_null(s, 2), "host", json_text_or_null(s, 6), "exited",
                              sqlite3_column_int(s, 3));
        if (p && sqlite3_column_text(s, 7) && sqlite3_column_text(s, 7)[0])
            json_object_set_new(p, "gpus", gpu_ids_json((const char *)sqlite3_column_text(s, 7)));
        if (p && sqlite3_column_int(s, 3)) {
            json_object_set_new(p, "exit_code", json_integer(sqlite3_column_int(s, 4)));
            json_object_set_new(p, "signal", json_integer(sqlite3_column_int(s, 5)));
        }
        json_array_append_new(arr, p);
    }
    sqlite3_reset(s);
    if (rc != MGE_OK) {
        json_decref(arr);
        return rc;
    }
    *out = arr;
    return MGE_OK;
}

/* The incarnations of job @id, oldest first, as a new JSON array in *@out. Lock held. */
static int incarnations_json(struct mge_store *st, int64_t id, json_t **out)
{
    json_t *arr = json_array();
    sqlite3_stmt *s = stmt_get(st, Q_INC_LIST);
    bool row;
    int rc;
    *out = NULL;
    if (!arr || !s) {
        json_decref(arr);
        return !s ? MGE_DB : MGE_NOMEM;
    }
    sqlite3_bind_int64(s, 1, id);
    while ((rc = step_row(st, s, &row)) == MGE_OK && row) {
        json_t *members = json_array();
        const char *names = (const char *)sqlite3_column_text(s, 8);
        while (members && names && *names) { /* worker names have no ',' (MPI host names) */
            size_t len = strcspn(names, ",");
            json_array_append_new(members, json_stringn(names, len));
            names += len + (names[len] == ',');
        }
        json_array_append_new(
            arr, json_pack("{s:i, s:i, s:o, s:I, s:o, s:o, s:o, s:o, s:b}", "incarnation",
                           sqlite3_column_int(s, 0), "world", sqlite3_column_int(s, 1), "members",
                           members ? members : json_null(), "start_step",
                           (json_int_t)sqlite3_column_int64(s, 2), "started_at", json_time(s, 3),
                           "ended_at", json_time(s, 4), "ended", json_text_or_null(s, 5), "reason",
                           json_text_or_null(s, 6), "infra", sqlite3_column_int(s, 7)));
    }
    sqlite3_reset(s);
    if (rc != MGE_OK) {
        json_decref(arr);
        return rc;
    }
    *out = arr;
    return MGE_OK;
}

int mge_store_job_get(struct mge_store *st, int64_t id, json_t **out)
{
    sqlite3_stmt *s;
    json_t *o = NULL, *spec, *latest = NULL, *placement = NULL, *incs, *result = json_null();
    json_t *plan = NULL;
    int rc = MGE_OK, attempt, state, restarts;
    int64_t total, step = 0;
    bool row;

    *out = NULL;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, Q_JOB_GET);
    if (!s) {
        rc = MGE_DB;
        goto out_unlock;
    }
    sqlite3_bind_int64(s, 1, id);
    rc = step_one(st, s);
    if (rc != MGE_OK) {
        sqlite3_reset(s);
        json_decref(result);
        goto out_unlock;
    }
    state = sqlite3_column_int(s, 2);
    attempt = sqlite3_column_int(s, 4);
    spec = json_loads((const char *)sqlite3_column_text(s, 5), 0, NULL);
    if (sqlite3_column_type(s, 10) != SQLITE_NULL) {
        json_t *r = json_loads((const char *)sqlite3_column_text(s, 10), 0, NULL);
        if (r) {
            json_decref(result);
            result = r;
        }
    }
    total = sqlite3_column_int64(s, 11);
    restarts = sqlite3_column_int(s, 12);
    plan = sqlite3_column_type(s, 13) == SQLITE_NULL
               ? NULL
               : json_loads((const char *)sqlite3_column_text(s, 13), 0, NULL);
    o = json_pack("{s:I, s:s, s:s, s:i, s:i, s:o, s:o, s:o, s:o, s:o, s:o}", "id", (json_int_t)id,
                  "name", (const char *)sqlite3_column_text(s, 1), "state",
                  mge_job_state_name(state), "priority", sqlite3_column_int(s, 3), "attempt",
                  attempt, "spec", spec ? spec : json_null(), "created_at", json_time(s, 6),
                  "started_at", json_time(s, 7), "finished_at", json_time(s, 8),
                  "failure_reason", json_text_or_null(s, 9), "result", result);
    sqlite3_reset(s);
    if (!o) {
        json_decref(plan);
        rc = MGE_NOMEM;
        goto out_unlock;
    }
    json_object_set_new(o, "plan", plan ? plan : json_null());
    rc = placement_json(st, id, attempt, &placement);
    if (rc != MGE_OK)
        goto out_decref;
    json_object_set_new(o, "placement", placement);
    rc = incarnations_json(st, id, &incs);
    if (rc != MGE_OK)
        goto out_decref;
    json_object_set_new(o, "incarnations", incs);
    json_object_set_new(o, "restarts", json_integer(restarts));
    /* the attempt is the incarnation: one mpirun (or one process) per attempt */
    json_object_set_new(o, "incarnation", json_integer(attempt));
    latest = json_object();
    s = stmt_get(st, Q_METRICS_LATEST);
    if (!s || !latest) {
        rc = !s ? MGE_DB : MGE_NOMEM;
        goto out_decref;
    }
    {
        sqlite3_bind_int64(s, 1, id);
        while ((rc = step_row(st, s, &row)) == MGE_OK && row) {
            const char *name = (const char *)sqlite3_column_text(s, 0);
            int64_t st_step = sqlite3_column_int64(s, 1);
            json_object_set_new(latest, name,
                                json_pack("{s:I, s:f}", "step", (json_int_t)st_step, "value",
                                          sqlite3_column_double(s, 2)));
            if (!strcmp(name, "loss"))
                step = st_step;
        }
        sqlite3_reset(s);
        if (rc != MGE_OK)
            goto out_decref;
    }
    json_object_set_new(o, "latest_metrics", latest);
    json_object_set_new(o, "progress",
                        json_pack("{s:I, s:I, s:f}", "step", (json_int_t)step, "total_steps",
                                  (json_int_t)total,
                                  "fraction", total > 0 ? (double)step / (double)total : 0.0));
    *out = o;
    goto out_unlock;
out_decref:
    json_decref(latest);
    json_decref(o);
out_unlock:
    pthread_mutex_unlock(&st->mu);
    return rc;
}

static void row_from_stmt(sqlite3_stmt *s, struct mge_job_row *r)
{
    r->id = sqlite3_column_int64(s, 0);
    r->state = sqlite3_column_int(s, 1);
    r->priority = sqlite3_column_int(s, 2);
    r->attempt = sqlite3_column_int(s, 3);
    r->workers_min = sqlite3_column_int(s, 4);
    r->workers_max = sqlite3_column_int(s, 5);
    r->cpus = sqlite3_column_int(s, 6);
    r->gpus = sqlite3_column_int(s, 7);
    r->memory_mb = sqlite3_column_int64(s, 8);
    r->device = sqlite3_column_int(s, 9);
    r->total_steps = sqlite3_column_int64(s, 10);
    r->gpu_memory_mb = sqlite3_column_int64(s, 11);
}

int mge_store_job_row(struct mge_store *st, int64_t id, struct mge_job_row *out)
{
    sqlite3_stmt *s;
    int rc;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, Q_JOB_ROW);
    if (!s) {
        rc = MGE_DB;
    } else {
        sqlite3_bind_int64(s, 1, id);
        rc = step_one(st, s);
        if (rc == MGE_OK)
            row_from_stmt(s, out);
        sqlite3_reset(s);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int mge_store_job_spec(struct mge_store *st, int64_t id, char **out)
{
    sqlite3_stmt *s;
    int rc;
    *out = NULL;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, Q_JOB_SPEC);
    if (!s) {
        rc = MGE_DB;
    } else {
        sqlite3_bind_int64(s, 1, id);
        rc = step_one(st, s);
        if (rc == MGE_OK) {
            *out = mge_strdup((const char *)sqlite3_column_text(s, 0));
            rc = *out ? MGE_OK : MGE_NOMEM;
        }
        sqlite3_reset(s);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int mge_store_job_list(struct mge_store *st, int state, int64_t before_id, int limit,
                       json_t **out, int64_t *next)
{
    sqlite3_stmt *s;
    json_t *arr = json_array();
    int n = 0, i = 1, rc;
    int64_t last = 0;
    bool row;

    *out = NULL;
    *next = 0;
    if (!arr)
        return MGE_NOMEM;
    if (before_id <= 0)
        before_id = INT64_MAX;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, state >= 0 ? Q_JOB_LIST_STATE : Q_JOB_LIST);
    if (!s) {
        pthread_mutex_unlock(&st->mu);
        json_decref(arr);
        return MGE_DB;
    }
    if (state >= 0)
        sqlite3_bind_int(s, i++, state);
    sqlite3_bind_int64(s, i++, before_id);
    sqlite3_bind_int(s, i, limit + 1); /* one more tells whether there is a next page */
    while ((rc = step_row(st, s, &row)) == MGE_OK && row) {
        if (n == limit) {
            *next = last;
            break;
        }
        last = sqlite3_column_int64(s, 0);
        json_array_append_new(
            arr, json_pack("{s:I, s:s, s:s, s:i, s:i, s:o, s:o, s:o}", "id", (json_int_t)last,
                           "name", (const char *)sqlite3_column_text(s, 1), "state",
                           mge_job_state_name(sqlite3_column_int(s, 2)), "priority",
                           sqlite3_column_int(s, 3), "attempt", sqlite3_column_int(s, 4),
                           "created_at", json_time(s, 5), "finished_at", json_time(s, 6),
                           "failure_reason", json_text_or_null(s, 7)));
        n++;
    }
    sqlite3_reset(s);
    pthread_mutex_unlock(&st->mu);
    if (rc != MGE_OK) {
        *next = 0;
        json_decref(arr);
        return rc;
    }
    *out = arr;
    return MGE_OK;
}

int mge_store_jobs_queued(struct mge_store *st, int max, struct mge_job_row **rows, int *n)
{
    sqlite3_stmt *s;
    struct mge_job_row *r = mge_calloc((size_t)max > 0 ? (size_t)max : 1, sizeof(*r));
    int k = 0, rc = MGE_DB;
    bool row;
    *rows = NULL;
    *n = 0;
    if (!r)
        return MGE_NOMEM;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, Q_JOBS_QUEUED);
    if (s) {
        sqlite3_bind_int(s, 1, max);
        while (k < max && (rc = step_row(st, s, &row)) == MGE_OK && row)
            row_from_stmt(s, &r[k++]);
        if (k == max)
            rc = MGE_OK;
        sqlite3_reset(s);
    }
    pthread_mutex_unlock(&st->mu);
    if (rc != MGE_OK) {
        mge_free(r);
        return rc;
    }
    *rows = r;
    *n = k;
    return MGE_OK;
}

int mge_store_placements_active(struct mge_store *st, struct mge_placement **out, int *n)
{
    sqlite3_stmt *s;
    struct mge_placement *p = NULL;
    size_t k = 0, cap = 0;
    int rc = MGE_OK;
    bool row;
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, Q_PLACEMENTS_ACTIVE);
    if (!s) {
        rc = MGE_DB;
        goto out_unlock;
    }
    while ((rc = step_row(st, s, &row)) == MGE_OK && row) {
        if ((rc = mge_array_grow((void **)&p, &cap, k + 1, sizeof(*p))) != MGE_OK)
            break;
        memset(&p[k], 0, sizeof(p[k]));
        p[k].job_id = sqlite3_column_int64(s, 0);
        p[k].attempt = sqlite3_column_int(s, 1);
        p[k].rank = sqlite3_column_int(s, 2);
        snprintf(p[k].worker_id, sizeof(p[k].worker_id), "%s", sqlite3_column_text(s, 3));
        p[k].exited = sqlite3_column_int(s, 4) != 0;
        p[k].exit_code = sqlite3_column_int(s, 5);
        p[k].term_signal = sqlite3_column_int(s, 6);
        p[k].superseded = sqlite3_column_int(s, 7) != 0;
        if (!mge_gpu_mask_parse((const char *)sqlite3_column_text(s, 8), &p[k].gpu_mask))
            p[k].gpu_mask = 0; /* not ours: the rank holds no GPU the scheduler knows */
        k++;
    }
    sqlite3_reset(s);
out_unlock:
    pthread_mutex_unlock(&st->mu);
    if (rc != MGE_OK) {
        mge_free(p);
        return rc;
    }
    *out = p;
    *n = (int)k;
    return MGE_OK;
}

/* Current state and attempt of a job; how many restarts it may still be charged (@left) and how
 * many it was not (@infra); both may be NULL. Lock held. */
static int job_state_get(struct mge_store *st, int64_t id, int *state, int *attempt, int *left,
                         int *infra)
{
    sqlite3_stmt *s = stmt_get(st, Q_JOB_STATE_GET);
    int rc;
    if (!s)
        return MGE_DB;
    sqlite3_bind_int64(s, 1, id);
    rc = step_one(st, s);
    if (rc == MGE_OK) {
        *state = sqlite3_column_int(s, 0);
        *attempt = sqlite3_column_int(s, 1);
        if (left)
            *left = sqlite3_column_int(s, 2);
        if (infra)
            *infra = sqlite3_column_int(s, 3);
    }
    sqlite3_reset(s);
    return rc;
}

/* End incarnation @attempt of job @id: @how ("succeeded", "requeued", ...), @reason (may be
 * NULL), @infra (the infrastructure's fault, not charged to the job). Lock held, in a tx. */
static int incarnation_end(struct mge_store *st, int64_t id, int attempt, const char *how,
                           const char *reason, bool infra, int64_t now)
{
    sqlite3_stmt *s = stmt_get(st, Q_INC_END);
    if (!s)
        return MGE_DB;
    sqlite3_bind_int64(s, 1, id);
    sqlite3_bind_int(s, 2, attempt);
    sqlite3_bind_int64(s, 3, now);
    sqlite3_bind_text(s, 4, how, -1, SQLITE_STATIC);
    bind_text_or_null(s, 5, reason);
    sqlite3_bind_int(s, 6, infra);
    return exec_stmt(st, s);
}

/* Set state and append the event; a terminal state ends the incarnation. Lock held, in a tx. */
static int job_state_set(struct mge_store *st, int64_t id, int attempt, enum mge_job_state state,
                         const char *reason, int64_t now)
{
    sqlite3_stmt *s = stmt_get(st, Q_JOB_STATE_SET);
    int rc;
    if (!s)
        return MGE_DB;
    sqlite3_bind_int(s, 1, (int)state);
    sqlite3_bind_int64(s, 2, now);
    bind_text_or_null(s, 3, reason);
    sqlite3_bind_int64(s, 4, id);
    rc = exec_stmt(st, s);
    if (rc == MGE_OK)
        rc = event_state(st, id, state, attempt, reason, now);
    if (rc == MGE_OK && mge_job_state_is_terminal(state))
        rc = incarnation_end(st, id, attempt, mge_job_state_name(state), reason, false, now);
    return rc;
}

int mge_store_job_set_state(struct mge_store *st, int64_t id, int attempt, enum mge_job_state state,
                            const char *reason, bool *changed)
{
    int cur, cur_attempt, rc;
    bool moved = false;
    if (changed)
        *changed = false;
    pthread_mutex_lock(&st->mu);
    rc = tx(st, Q_BEGIN);
    if (rc != MGE_OK)
        goto out_unlock;
    rc = job_state_get(st, id, &cur, &cur_attempt, NULL, NULL);
    if (rc != MGE_OK)
        goto out_rollback;
    if (mge_job_state_is_terminal(cur) || (attempt > 0 && attempt != cur_attempt) ||
        cur == (int)state) {
        rc = tx(st, Q_COMMIT);
        goto out_unlock;
    }
    rc = job_state_set(st, id, cur_attempt, state, reason, mge_now_ms());
    if (rc != MGE_OK)
        goto out_rollback;
    rc = tx(st, Q_COMMIT);
    moved = rc == MGE_OK;
    if (moved && changed)
        *changed = true;
    goto out_unlock;
out_rollback:
    tx(st, Q_ROLLBACK);
out_unlock:
    pthread_mutex_unlock(&st->mu);
    if (moved)
        events_notify(st, id);
    return rc;
}

int mge_store_job_requeue(struct mge_store *st, int64_t id, int attempt, const char *reason,
                          bool charged, bool *requeued)
{
    int cur, cur_attempt, left, infra, rc;
    int64_t now = mge_now_ms();
    sqlite3_stmt *s;
    *requeued = false;
    pthread_mutex_lock(&st->mu);
    rc = tx(st, Q_BEGIN);
    if (rc != MGE_OK)
        goto out_unlock;
    rc = job_state_get(st, id, &cur, &cur_attempt, &left, &infra);
    if (rc != MGE_OK)
        goto out_rollback;
    if (mge_job_state_is_terminal(cur) || attempt != cur_attempt) {
        rc = tx(st, Q_COMMIT);
        goto out_unlock;
    }
    if (charged ? left <= 0 : infra >= MGE_STORE_INFRA_RESTARTS_MAX) {
        rc = job_state_set(st, id, cur_attempt, MGE_JOB_FAILED, reason, now);
    } else {
        /* The attempt failed (an event says so and why); the job itself goes back in line. */
        rc = event_state(st, id, MGE_JOB_FAILED, cur_attempt, reason, now);
        if (rc == MGE_OK)
            rc = incarnation_end(st, id, cur_attempt, "requeued", reason, !charged, now);
        s = rc == MGE_OK ? stmt_get(st, Q_JOB_REQUEUE) : NULL;
        if (s) {
            bind_text_or_null(s, 1, reason);
            sqlite3_bind_int64(s, 2, id);
            sqlite3_bind_int(s, 3, charged);
            rc = exec_stmt(st, s);
        } else if (rc == MGE_OK) {
            rc = MGE_DB;
        }
        if (rc == MGE_OK)
            rc = event_state(st, id, MGE_JOB_QUEUED, cur_attempt + 1, "requeued", now);
        *requeued = rc == MGE_OK;
    }
    if (rc != MGE_OK)
        goto out_rollback;
    rc = tx(st, Q_COMMIT);
    if (rc != MGE_OK) {
        *requeued = false;
        goto out_unlock;
    }
    pthread_mutex_unlock(&st->mu);
    events_notify(st, id);
    return MGE_OK;
out_rollback:
    *requeued = false;
    tx(st, Q_ROLLBACK);
out_unlock:
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int mge_store_job_place(struct mge_store *st, int64_t id, int attempt,
                        const struct mge_placement *pl, int n)
{
    char ids[200];
    int rc;
    pthread_mutex_lock(&st->mu);
    rc = tx(st, Q_BEGIN);
    if (rc != MGE_OK)
        goto out_unlock;
    for (int i = 0; i < n && rc == MGE_OK; i++) {
        sqlite3_stmt *s = stmt_get(st, Q_PLACE_INSERT);
        if (!s) {
            rc = MGE_DB;
            break;
        }
        sqlite3_bind_int64(s, 1, id);
        sqlite3_bind_int(s, 2, attempt);
        sqlite3_bind_int(s, 3, pl[i].rank);
        sqlite3_bind_text(s, 4, pl[i].worker_id, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 5, mge_gpu_mask_format(pl[i].gpu_mask, ids, sizeof(ids)), -1,
                          SQLITE_TRANSIENT);
        rc = exec_stmt(st, s);
    }
    for (enum sql_id q = Q_INC_INSERT; rc == MGE_OK && q <= Q_INC_RESIZED; q++) {
        sqlite3_stmt *s = stmt_get(st, q);
        if (!s) {
            rc = MGE_DB;
            break;
        }
        sqlite3_bind_int64(s, 1, id);
        sqlite3_bind_int(s, 2, attempt);
        sqlite3_bind_int(s, 3, n);
        if (q == Q_INC_INSERT)
            sqlite3_bind_int64(s, 4, mge_now_ms());
        rc = exec_stmt(st, s);
    }
    if (rc == MGE_OK)
        rc = job_state_set(st, id, attempt, MGE_JOB_RUNNING, NULL, mge_now_ms());
    if (rc == MGE_OK)
        rc = tx(st, Q_COMMIT);
    else
        tx(st, Q_ROLLBACK);
out_unlock:
    pthread_mutex_unlock(&st->mu);
    if (rc == MGE_OK)
        events_notify(st, id);
    return rc;
}

int mge_store_placement_exit(struct mge_store *st, int64_t job_id, int attempt, int rank,
                             int exit_code, int term_signal)
{
    sqlite3_stmt *s;
    int rc = MGE_DB;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, Q_PLACE_EXIT);
    if (s) {
        sqlite3_bind_int(s, 1, exit_code);
        sqlite3_bind_int(s, 2, term_signal);
        sqlite3_bind_int64(s, 3, job_id);
        sqlite3_bind_int(s, 4, attempt);
        sqlite3_bind_int(s, 5, rank);
        rc = exec_stmt(st, s);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

/*
 * Metrics of one JSON line of rank 0. mge-train --json prints three kinds:
 *   {"step":N,"loss":..,"samples_per_sec":..,"lr":..,"epoch":E}         a training step
 *   {"epoch":E,"step":N,"test_accuracy":..,"test_loss":..}              an evaluation
 *   {"summary":true,"steps":..,"final_loss":..,...}                     the end of the run
 * Every number of a step or evaluation line is stored as the metric of that name at step N;
 * both lines' "epoch" counts the epochs finished after step N, and the step line's is the one
 * kept. Lock held, in a transaction.
 */
static int ingest_metric(struct mge_store *st, const struct mge_store_line *l)
{
    json_t *o = json_loads(l->text, 0, NULL), *v;
    const char *key;
    int64_t step = -1;
    bool eval;
    int rc = MGE_OK;
    sqlite3_stmt *s;

    if (!json_is_object(o))
        goto out_decref;
    if (json_is_true(json_object_get(o, "summary")) || json_object_get(o, "final_loss")) {
        /* the summary line ends the run (of a running job's current attempt only) */
        s = stmt_get(st, Q_JOB_RESULT);
        if (s) {
            sqlite3_bind_text(s, 1, l->text, -1, SQLITE_TRANSIENT);
            sqlite3_bind_int64(s, 2, l->job_id);
            sqlite3_bind_int(s, 3, l->attempt);
            rc = exec_stmt(st, s);
        }
        goto out_decref;
    }
    v = json_object_get(o, "step");
    if (json_is_integer(v)) {
        step = json_integer_value(v);
    } else {
        /* an evaluation line: it belongs to the last step trained */
        s = stmt_get(st, Q_METRIC_MAXSTEP);
        if (!s) {
            rc = MGE_DB;
            goto out_decref;
        }
        sqlite3_bind_int64(s, 1, l->job_id);
        rc = step_one(st, s); /* an aggregate: always one row */
        if (rc == MGE_OK)
            step = sqlite3_column_int64(s, 0);
        sqlite3_reset(s);
        if (rc != MGE_OK)
            goto out_decref;
        if (step < 0)
            step = 0;
    }
    eval = !json_object_get(o, "loss");
    json_object_foreach(o, key, v)
    {
        if (!json_is_number(v) || !strcmp(key, "step") || (eval && !strcmp(key, "epoch")))
            continue;
        s = stmt_get(st, Q_METRIC_UPSERT);
        if (!s) {
            rc = MGE_DB;
            break;
        }
        sqlite3_bind_int64(s, 1, l->job_id);
        sqlite3_bind_text(s, 2, key, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(s, 3, step);
        sqlite3_bind_double(s, 4, json_number_value(v));
        sqlite3_bind_int64(s, 5, l->time_ms);
        rc = exec_stmt(st, s);
        if (rc != MGE_OK)
            break;
    }
out_decref:
    json_decref(o);
    return rc;
}

/*
 * Whether checkpoint notice @l of worker @worker_id ("NAME STEP SIZE PATH", @name and @path
 * parsed from it) names a file this coordinator may store, and later serve: a checkpoint of
 * the line's own job, attempt and rank in its output directory (ckpt_path.h). Warns when not.
 */
static bool ckpt_notice_believed(const char *worker_id, const struct mge_store_line *l,
                                 const char *name, const char *path)
{
    char why[300];
    if (mge_ckpt_path_ok(l->job_id, l->attempt, l->rank, name, path, why, sizeof(why)))
        return true;
    mge_log_warn("worker %s: checkpoint '%.100s' of job %lld attempt %d rank %d refused: "
                 "'%.300s': %s", worker_id, name, (long long)l->job_id, l->attempt, l->rank, path,
                 why);
    return false;
}

/* A checkpoint notice "NAME STEP SIZE PATH". Lock held, in a transaction. */
static int ingest_checkpoint(struct mge_store *st, const char *worker_id,
                             const struct mge_store_line *l)
{
    char name[256];
    long long step, size;
    int off = 0;
    sqlite3_stmt *s;
    if (sscanf(l->text, "%255s %lld %lld %n", name, &step, &size, &off) != 3 || off <= 0 ||
        !ckpt_notice_believed(worker_id, l, name, l->text + off))
        return MGE_OK;
    s = stmt_get(st, Q_CKPT_UPSERT);
    if (!s)
        return MGE_DB;
    sqlite3_bind_int64(s, 1, l->job_id);
    sqlite3_bind_text(s, 2, name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(s, 3, step);
    sqlite3_bind_int64(s, 4, size);
    sqlite3_bind_text(s, 5, l->text + off, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 6, worker_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(s, 7, l->time_ms);
    return exec_stmt(st, s);
}

/*
 * Whether line @l from worker @worker_id is the current attempt's, from the worker that
 * attempt placed its rank on; *@state receives the job's state when it is. Lock held.
 */
static int line_fence(struct mge_store *st, const char *worker_id, const struct mge_store_line *l,
                      bool *current, int *state)
{
    sqlite3_stmt *s = stmt_get(st, Q_LINE_FENCE);
    int rc;
    *current = false;
    if (!s)
        return MGE_DB;
    sqlite3_bind_int64(s, 1, l->job_id);
    sqlite3_bind_int(s, 2, l->attempt);
    sqlite3_bind_int(s, 3, l->rank);
    sqlite3_bind_text(s, 4, worker_id, -1, SQLITE_TRANSIENT);
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        *current = true;
        *state = sqlite3_column_int(s, 0);
    }
    sqlite3_reset(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return err_db(st, "cannot check a line's placement");
    return MGE_OK;
}

int mge_store_lines_ingest(struct mge_store *st, const char *worker_id,
                           const struct mge_store_line *lines, size_t n)
{
    int rc, state = 0;
    int64_t last_job = -1, prune_job = -1;
    int last_attempt = -1, last_rank = -1;
    bool current = false;
    size_t logs_in_job = 0, dropped = 0;
    const struct mge_store_line *first_dropped = NULL;

    if (n == 0)
        return MGE_OK;
    pthread_mutex_lock(&st->mu);
    rc = tx(st, Q_BEGIN);
    if (rc != MGE_OK)
        goto out_unlock;
    for (size_t i = 0; i < n && rc == MGE_OK; i++) {
        const struct mge_store_line *l = &lines[i];
        const char *kind = l->stream == 2 ? "metric" : l->stream == 3 ? "checkpoint" : "log";
        sqlite3_stmt *s;
        if (l->job_id != last_job || l->attempt != last_attempt || l->rank != last_rank) {
            rc = line_fence(st, worker_id, l, &current, &state);
            if (rc != MGE_OK)
                break;
            if (l->job_id != last_job)
                logs_in_job = 0;
            last_job = l->job_id;
            last_attempt = l->attempt;
            last_rank = l->rank;
        }
        /* A stale attempt (its worker was lost and came back) or another worker's rank is
         * dropped; so are metrics and checkpoints that come after the job ended, so that a
         * finished job's result, metrics and checkpoints stay as they were. The caller still
         * acks them: the worker must stop sending them. */
        if (!current || (l->stream >= 2 && mge_job_state_is_terminal(state))) {
            if (!dropped++)
                first_dropped = l;
            continue;
        }
        s = stmt_get(st, Q_LINE_INSERT);
        if (!s) {
            rc = MGE_DB;
            break;
        }
        sqlite3_bind_int64(s, 1, l->job_id);
        sqlite3_bind_text(s, 2, kind, -1, SQLITE_STATIC);
        sqlite3_bind_int(s, 3, l->attempt);
        sqlite3_bind_int(s, 4, l->rank);
        sqlite3_bind_int64(s, 5, (sqlite3_int64)l->seq);
        sqlite3_bind_int(s, 6, l->stream);
        sqlite3_bind_text(s, 7, l->text ? l->text : "", -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(s, 8, l->time_ms);
        rc = exec_stmt(st, s);
        if (rc != MGE_OK || sqlite3_changes(st->db) == 0)
            continue; /* a duplicate: stored before a restart or a lost ack */
        if (l->stream == 2 && l->rank == 0)
            rc = ingest_metric(st, l);
        else if (l->stream == 3)
            rc = ingest_checkpoint(st, worker_id, l);
        else if (l->stream < 2 && ++logs_in_job % 1000 == 0)
            prune_job = l->job_id;
    }
    if (rc == MGE_OK && prune_job > 0) {
        sqlite3_stmt *s = stmt_get(st, Q_LOG_PRUNE);
        if (s) {
            sqlite3_bind_int64(s, 1, prune_job);
            sqlite3_bind_int(s, 2, LOGS_PER_JOB_MAX);
            rc = exec_stmt(st, s);
        }
    }
    if (rc == MGE_OK)
        rc = tx(st, Q_COMMIT);
    else
        tx(st, Q_ROLLBACK);
    if (rc == MGE_OK && dropped) {
        st->lines_fenced += dropped;
        mge_log_warn("dropped %zu line(s) from worker %s: not from the current attempt's placement"
                     " on it, or after the job ended (first: job %lld attempt %d rank %d)",
                     dropped, worker_id, (long long)first_dropped->job_id, first_dropped->attempt,
                     first_dropped->rank);
    }
out_unlock:
    pthread_mutex_unlock(&st->mu);
    if (rc == MGE_OK)
        events_notify_lines(st, lines, n);
    return rc;
}

uint64_t mge_store_lines_fenced(struct mge_store *st)
{
    uint64_t n;
    pthread_mutex_lock(&st->mu);
    n = st->lines_fenced;
    pthread_mutex_unlock(&st->mu);
    return n;
}

int mge_store_events(struct mge_store *st, int64_t job_id, int64_t after_id, int limit, json_t **out)
{
    sqlite3_stmt *s;
    json_t *arr = json_array();
    bool row;
    int rc;
    *out = NULL;
    if (!arr)
        return MGE_NOMEM;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, Q_EVENTS);
    if (!s) {
        pthread_mutex_unlock(&st->mu);
        json_decref(arr);
        return MGE_DB;
    }
    sqlite3_bind_int64(s, 1, job_id);
    sqlite3_bind_int64(s, 2, after_id);
    sqlite3_bind_int(s, 3, limit);
    while ((rc = step_row(st, s, &row)) == MGE_OK && row) {
        const char *kind = (const char *)sqlite3_column_text(s, 1);
        const char *data = (const char *)sqlite3_column_text(s, 5);
        json_t *d;
        if (!strcmp(kind, "state") || !strcmp(kind, "metric")) {
            d = json_loads(data, 0, NULL);
            if (!json_is_object(d)) {
                json_decref(d);
                d = json_pack("{s:s}", "text", data);
            }
        } else {
            d = json_pack("{s:s}", "text", data);
        }
        if (!d)
            continue;
        if (sqlite3_column_type(s, 3) != SQLITE_NULL) {
            json_object_set_new(d, "rank", json_integer(sqlite3_column_int(s, 3)));
            if (!strcmp(kind, "log"))
                json_object_set_new(d, "stream", json_string(sqlite3_column_int(s, 4) == 1
                                                                 ? "stderr" : "stdout"));
        }
        json_object_set_new(d, "time", json_time(s, 6));
        json_array_append_new(arr, json_pack("{s:I, s:s, s:o}", "id",
                                             (json_int_t)sqlite3_column_int64(s, 0), "kind", kind,
                                             "data", d));
    }
    sqlite3_reset(s);
    pthread_mutex_unlock(&st->mu);
    if (rc != MGE_OK) {
        json_decref(arr);
        return rc;
    }
    *out = arr;
    return MGE_OK;
}

int mge_store_events_last_id(struct mge_store *st, int64_t job_id, int64_t *out)
{
    sqlite3_stmt *s;
    int rc = MGE_DB;
    *out = 0;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, Q_EVENTS_LAST);
    if (s) {
        sqlite3_bind_int64(s, 1, job_id);
        rc = step_one(st, s); /* an aggregate: always one row */
        if (rc == MGE_OK)
            *out = sqlite3_column_int64(s, 0);
        sqlite3_reset(s);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int mge_store_logs(struct mge_store *st, int64_t job_id, int rank, int tail, json_t **out)
{
    sqlite3_stmt *s;
    json_t *arr = json_array();
    bool row;
    int rc;
    *out = NULL;
    if (!arr)
        return MGE_NOMEM;
    if (tail <= 0)
        tail = 1000;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, rank >= 0 ? Q_LOGS_RANK : Q_LOGS_ALL);
    if (!s) {
        pthread_mutex_unlock(&st->mu);
        json_decref(arr);
        return MGE_DB;
    }
    sqlite3_bind_int64(s, 1, job_id);
    if (rank >= 0) {
        sqlite3_bind_int(s, 2, rank);
        sqlite3_bind_int(s, 3, tail);
    } else {
        sqlite3_bind_int(s, 2, tail);
    }
    while ((rc = step_row(st, s, &row)) == MGE_OK && row)
        json_array_append_new(
            arr, json_pack("{s:I, s:i, s:i, s:I, s:s, s:s, s:o}", "id",
                           (json_int_t)sqlite3_column_int64(s, 0), "attempt",
                           sqlite3_column_int(s, 1), "rank", sqlite3_column_int(s, 2), "seq",
                           (json_int_t)sqlite3_column_int64(s, 3), "stream",
                           sqlite3_column_int(s, 4) == 1 ? "stderr" : "stdout", "text",
                           (const char *)sqlite3_column_text(s, 5), "time", json_time(s, 6)));
    sqlite3_reset(s);
    pthread_mutex_unlock(&st->mu);
    if (rc != MGE_OK) {
        json_decref(arr);
        return rc;
    }
    *out = json_pack("{s:o}", "lines", arr);
    return *out ? MGE_OK : MGE_NOMEM;
}

int mge_store_metrics(struct mge_store *st, int64_t job_id, const char *name, int64_t since_step,
                      json_t **out)
{
    sqlite3_stmt *s;
    json_t *arr = json_array();
    bool row;
    int rc;
    *out = NULL;
    if (!arr)
        return MGE_NOMEM;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, name ? Q_METRICS_NAME : Q_METRICS_ALL);
    if (!s) {
        pthread_mutex_unlock(&st->mu);
        json_decref(arr);
        return MGE_DB;
    }
    sqlite3_bind_int64(s, 1, job_id);
    if (name) {
        sqlite3_bind_text(s, 2, name, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(s, 3, since_step);
    } else {
        sqlite3_bind_int64(s, 2, since_step);
    }
    while ((rc = step_row(st, s, &row)) == MGE_OK && row)
        json_array_append_new(arr, json_pack("{s:I, s:s, s:f, s:o}", "step",
                                             (json_int_t)sqlite3_column_int64(s, 0), "name",
                                             (const char *)sqlite3_column_text(s, 1), "value",
                                             sqlite3_column_double(s, 2), "time",
                                             json_time(s, 3)));
    sqlite3_reset(s);
    pthread_mutex_unlock(&st->mu);
    if (rc != MGE_OK) {
        json_decref(arr);
        return rc;
    }
    *out = json_pack("{s:o}", "metrics", arr);
    return *out ? MGE_OK : MGE_NOMEM;
}

int mge_store_checkpoints(struct mge_store *st, int64_t job_id, json_t **out)
{
    sqlite3_stmt *s;
    json_t *arr = json_array();
    bool row;
    int rc = MGE_DB;
    *out = NULL;
    if (!arr)
        return MGE_NOMEM;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, Q_CKPT_LIST);
    if (s) {
        sqlite3_bind_int64(s, 1, job_id);
        while ((rc = step_row(st, s, &row)) == MGE_OK && row)
            json_array_append_new(arr, json_pack("{s:s, s:I, s:I, s:o, s:o, s:o, s:b}", "name",
                                                 (const char *)sqlite3_column_text(s, 0), "step",
                                                 (json_int_t)sqlite3_column_int64(s, 1), "size",
                                                 (json_int_t)sqlite3_column_int64(s, 2),
                                                 "worker_id", json_text_or_null(s, 3), "worker",
                                                 json_text_or_null(s, 4), "time", json_time(s, 5),
                                                 "committed", sqlite3_column_int(s, 6)));
        sqlite3_reset(s);
    }
    pthread_mutex_unlock(&st->mu);
    if (rc != MGE_OK) {
        json_decref(arr);
        return rc;
    }
    *out = arr;
    return MGE_OK;
}

static int path_query(struct mge_store *st, enum sql_id q, int64_t job_id, const char *name,
                      char **out)
{
    sqlite3_stmt *s;
    int rc;
    *out = NULL;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, q);
    if (!s) {
        rc = MGE_DB;
    } else {
        sqlite3_bind_int64(s, 1, job_id);
        if (name)
            sqlite3_bind_text(s, 2, name, -1, SQLITE_TRANSIENT);
        rc = step_one(st, s);
        if (rc == MGE_OK) {
            *out = mge_strdup((const char *)sqlite3_column_text(s, 0));
            rc = *out ? MGE_OK : MGE_NOMEM;
        }
        sqlite3_reset(s);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int mge_store_checkpoint_path(struct mge_store *st, int64_t job_id, const char *name, char **out)
{
    if (!strcmp(name, "latest"))
        return path_query(st, Q_CKPT_LATEST, job_id, NULL, out);
    return path_query(st, Q_CKPT_PATH, job_id, name, out);
}

int mge_store_checkpoint_latest(struct mge_store *st, int64_t job_id, char **out)
{
    return path_query(st, Q_CKPT_LATEST, job_id, NULL, out);
}

int mge_store_rank_is_current(struct mge_store *st, const char *worker_id, int64_t job_id,
                              int attempt, int rank, bool *current)
{
    struct mge_store_line l = {.job_id = job_id, .attempt = attempt, .rank = rank};
    int state = 0, rc;
    pthread_mutex_lock(&st->mu);
    rc = line_fence(st, worker_id, &l, current, &state);
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int mge_store_checkpoint_commit(struct mge_store *st, int64_t job_id, const char *name,
                                int64_t step, int64_t size, const char *worker_path,
                                const char *worker_id, const char *copy)
{
    sqlite3_stmt *s;
    struct timespec ts;
    int rc = MGE_DB;
    clock_gettime(CLOCK_REALTIME, &ts);
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, Q_CKPT_COMMIT);
    if (s) {
        sqlite3_bind_int64(s, 1, job_id);
        sqlite3_bind_text(s, 2, name, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(s, 3, step);
        sqlite3_bind_int64(s, 4, size);
        sqlite3_bind_text(s, 5, worker_path, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 6, worker_id, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(s, 7, (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
        sqlite3_bind_text(s, 8, copy, -1, SQLITE_TRANSIENT);
        rc = exec_stmt(st, s);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int mge_store_incarnation_start_step(struct mge_store *st, int64_t job_id, int attempt,
                                     int64_t step)
{
    sqlite3_stmt *s;
    int rc = MGE_DB;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, Q_INC_START);
    if (s) {
        sqlite3_bind_int64(s, 1, job_id);
        sqlite3_bind_int(s, 2, attempt);
        sqlite3_bind_int64(s, 3, step);
        rc = exec_stmt(st, s);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int mge_store_checkpoint_copy_latest(struct mge_store *st, int64_t job_id, char **name)
{
    return path_query(st, Q_CKPT_COPY_LATEST, job_id, NULL, name);
}

int mge_store_checkpoint_copy_path(struct mge_store *st, int64_t job_id, const char *name,
                                   char **out)
{
    return path_query(st, Q_CKPT_COPY_PATH, job_id, name, out);
}

int mge_store_checkpoint_copy_prune(struct mge_store *st, int64_t job_id, int keep, char **out)
{
    sqlite3_stmt *s;
    int rc = MGE_DB;
    *out = NULL;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, Q_CKPT_COPY_OLD);
    if (s) {
        sqlite3_bind_int64(s, 1, job_id);
        sqlite3_bind_int(s, 2, keep);
        rc = step_one(st, s);
        if (rc == MGE_OK)
            *out = mge_strdup((const char *)sqlite3_column_text(s, 0));
        sqlite3_reset(s);
        if (rc == MGE_OK && !*out)
            rc = MGE_NOMEM;
    }
    if (rc == MGE_OK) {
        s = stmt_get(st, Q_CKPT_COPY_DROP);
        rc = MGE_DB;
        if (s) {
            sqlite3_bind_int64(s, 1, job_id);
            sqlite3_bind_text(s, 2, *out, -1, SQLITE_TRANSIENT);
            rc = exec_stmt(st, s);
        }
    }
    pthread_mutex_unlock(&st->mu);
    if (rc != MGE_OK) {
        mge_free(*out);
        *out = NULL;
    }
    return rc;
}

int mge_store_job_counts(struct mge_store *st, int64_t counts[MGE_JOB__NSTATES])
{
    sqlite3_stmt *s;
    bool row;
    int rc = MGE_DB;
    memset(counts, 0, sizeof(int64_t) * MGE_JOB__NSTATES);
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, Q_JOB_COUNTS);
    if (s) {
        while ((rc = step_row(st, s, &row)) == MGE_OK && row) {
            int k = sqlite3_column_int(s, 0);
            if (k >= 0 && k < MGE_JOB__NSTATES)
                counts[k] = sqlite3_column_int64(s, 1);
        }
        sqlite3_reset(s);
    }
    pthread_mutex_unlock(&st->mu);
    if (rc != MGE_OK)
        memset(counts, 0, sizeof(int64_t) * MGE_JOB__NSTATES);
    return rc;
}

static void random_id(char *buf, size_t n)
{
    unsigned char r[8];
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(r, 1, sizeof(r), f) != sizeof(r)) {
        int64_t t = mge_now_ms() ^ (int64_t)(intptr_t)buf;
        memcpy(r, &t, sizeof(r));
    }
    if (f)
        fclose(f);
    snprintf(buf, n, "w-%02x%02x%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2], r[3], r[4], r[5],
             r[6], r[7]);
}

/* @w's GPUs as the workers.gpu_list column keeps them, "MIB NAME" per line; NULL on OOM. */
static char *gpu_list_text(const struct mge_worker_row *w)
{
    size_t cap = (size_t)(w->gpus > 0 ? w->gpus : 0) * (sizeof(w->gpu[0].name) + 24) + 1, off = 0;
    char *t = mge_malloc(cap);
    if (!t)
        return NULL;
    t[0] = '\0';
    for (int i = 0; i < w->gpus && i < MGE_GPUS_MAX; i++) {
        int k = snprintf(t + off, cap - off, "%s%lld %s", i ? "\n" : "",
                         (long long)w->gpu[i].memory_mb, w->gpu[i].name);
        if (k < 0 || (size_t)k >= cap - off)
            break;
        off += (size_t)k;
    }
    return t;
}

/* The workers.gpu_list column @t into @w->gpu (at most @w->gpus entries; the rest stay zero). */
static void gpu_list_parse(const char *t, struct mge_worker_row *w)
{
    for (int i = 0; t && *t && i < w->gpus && i < MGE_GPUS_MAX; i++) {
        const char *nl = strchr(t, '\n'), *sp;
        size_t len = nl ? (size_t)(nl - t) : strlen(t);
        w->gpu[i].memory_mb = strtoll(t, NULL, 10);
        sp = memchr(t, ' ', len);
        if (sp)
            snprintf(w->gpu[i].name, sizeof(w->gpu[i].name), "%.*s",
                     (int)(len - (size_t)(sp + 1 - t)), sp + 1);
        t = nl ? nl + 1 : t + len;
    }
}

int mge_store_worker_upsert(struct mge_store *st, struct mge_worker_row *w)
{
    char *gpu_list = NULL;
    sqlite3_stmt *s;
    int rc = MGE_DB;
    bool found = false;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, Q_WORKER_BY_NAME);
    if (!s)
        goto out_unlock;
    sqlite3_bind_text(s, 1, w->name, -1, SQLITE_TRANSIENT);
    rc = step_row(st, s, &found);
    if (rc == MGE_OK && found)
        snprintf(w->id, sizeof(w->id), "%s", sqlite3_column_text(s, 0));
    sqlite3_reset(s);
    if (rc != MGE_OK)
        goto out_unlock;
    rc = MGE_DB;
    s = stmt_get(st, found ? Q_WORKER_UPDATE : Q_WORKER_INSERT);
    if (!s)
        goto out_unlock;
    gpu_list = gpu_list_text(w);
    if (!gpu_list) {
        rc = MGE_NOMEM;
        goto out_unlock;
    }
    if (found) {
        sqlite3_bind_text(s, 1, w->host, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(s, 2, w->cpus);
        sqlite3_bind_int(s, 3, w->gpus);
        sqlite3_bind_int64(s, 4, w->memory_mb);
        sqlite3_bind_text(s, 5, w->device, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 6, w->version, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(s, 7, w->registered_ms);
        sqlite3_bind_text(s, 8, w->launch_url, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 9, gpu_list, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 10, w->id, -1, SQLITE_TRANSIENT);
    } else {
        random_id(w->id, sizeof(w->id));
        sqlite3_bind_text(s, 1, w->id, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 2, w->name, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 3, w->host, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(s, 4, w->cpus);
        sqlite3_bind_int(s, 5, w->gpus);
        sqlite3_bind_int64(s, 6, w->memory_mb);
        sqlite3_bind_text(s, 7, w->device, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 8, w->version, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 9, "ready", -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 10, w->registered_ms);
        sqlite3_bind_text(s, 11, w->launch_url, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 12, gpu_list, -1, SQLITE_TRANSIENT);
    }
    rc = exec_stmt(st, s);
out_unlock:
    pthread_mutex_unlock(&st->mu);
    mge_free(gpu_list);
    return rc;
}

int mge_store_worker_set_state(struct mge_store *st, const char *id, const char *state)
{
    sqlite3_stmt *s;
    int rc = MGE_DB;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, Q_WORKER_STATE);
    if (s) {
        sqlite3_bind_text(s, 1, state, -1, SQLITE_TRANSIENT);
        sqlite3_bind_text(s, 2, id, -1, SQLITE_TRANSIENT);
        rc = exec_stmt(st, s);
    }
    pthread_mutex_unlock(&st->mu);
    return rc;
}

int mge_store_workers_load(struct mge_store *st, struct mge_worker_row **out, int *n)
{
    sqlite3_stmt *s;
    struct mge_worker_row *w = NULL;
    size_t k = 0, cap = 0;
    int rc = MGE_OK;
    bool row;
    *out = NULL;
    *n = 0;
    pthread_mutex_lock(&st->mu);
    s = stmt_get(st, Q_WORKERS_ALL);
    if (!s) {
        rc = MGE_DB;
        goto out_unlock;
    }
    while ((rc = step_row(st, s, &row)) == MGE_OK && row) {
        if ((rc = mge_array_grow((void **)&w, &cap, k + 1, sizeof(*w))) != MGE_OK)
            break;
        memset(&w[k], 0, sizeof(w[k]));
        snprintf(w[k].id, sizeof(w[k].id), "%s", sqlite3_column_text(s, 0));
        snprintf(w[k].name, sizeof(w[k].name), "%s", sqlite3_column_text(s, 1));
        snprintf(w[k].host, sizeof(w[k].host), "%s", sqlite3_column_text(s, 2));
        w[k].cpus = sqlite3_column_int(s, 3);
        w[k].gpus = sqlite3_column_int(s, 4);
        w[k].memory_mb = sqlite3_column_int64(s, 5);
        snprintf(w[k].device, sizeof(w[k].device), "%s", sqlite3_column_text(s, 6));
        snprintf(w[k].version, sizeof(w[k].version), "%s", sqlite3_column_text(s, 7));
        snprintf(w[k].state, sizeof(w[k].state), "%s", sqlite3_column_text(s, 8));
        w[k].registered_ms = sqlite3_column_int64(s, 9);
        snprintf(w[k].launch_url, sizeof(w[k].launch_url), "%s", sqlite3_column_text(s, 10));
        gpu_list_parse((const char *)sqlite3_column_text(s, 11), &w[k]);
        k++;
    }
    sqlite3_reset(s);
out_unlock:
    pthread_mutex_unlock(&st->mu);
    if (rc != MGE_OK) {
        mge_free(w);
        return rc;
    }
    *out = w;
    *n = (int)k;
    return MGE_OK;
}
