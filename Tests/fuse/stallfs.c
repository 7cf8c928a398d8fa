/*
 * stallfs -- a read-only FUSE file system that stalls chosen operations on
 * command.
 *
 * Purpose
 * -------
 * Tests use it to prove that the dragbroker daemon is never blocked by a
 * descriptor a client hands it when that descriptor lives on a file system
 * that stalls: the test opens a file on a stallfs mount, passes the
 * descriptor to the daemon (SCM_RIGHTS), tells stallfs to stall getattr
 * (fstat), open, read, flush (every close(2)), release or statfs, and then
 * checks that the daemon keeps answering other clients.
 *
 * Build (libfuse3 >= 3.14, e.g. Debian's libfuse3-dev):
 *   gcc -Wall -Wextra -O2 -o stallfs stallfs.c \
 *       $(pkg-config --cflags --libs fuse3) -lpthread
 *
 * Run (as root, or with user_allow_other in /etc/fuse.conf):
 *   stallfs BACKING_DIR CONTROL_FILE MOUNTPOINT [fuse options]
 *   e.g. stallfs /tmp/back /tmp/ctl /tmp/mnt -o allow_other
 * It always runs in the foreground (-f is added) and multithreaded, so a
 * stalled request never holds up other requests or the control mechanism.
 * Every stalled request occupies one libfuse worker thread; libfuse's
 * default cap is 10 worker threads, so stallfs passes -o max_threads=256
 * before your options (give your own -o max_threads=N to override).
 *
 * What it serves
 * --------------
 * Every regular file directly in BACKING_DIR (flat, no subdirectories),
 * read-only: mode 0444, owner/group/size/times of the backing file; the
 * root directory is mode 0555.  open(2) for writing fails with EACCES.
 * Attribute and entry caching are off and direct_io is on, so every
 * fstat(2), path lookup and read(2) reaches the server; FOPEN_NOFLUSH is
 * never set, so every close(2) of a descriptor on the mount sends FLUSH
 * on behalf of the process that calls close(2) (see "About pids").
 * RELEASE is sent when the last reference to the open file goes away; the
 * kernel sends it asynchronously and without credentials, so it is logged
 * with pid 0 and stalling it blocks nobody's close(2).
 *
 * Control file
 * ------------
 * CONTROL_FILE is a text file the test writes atomically (write a temporary
 * file, then rename(2) it over CONTROL_FILE).  A missing control file means
 * nothing stalls.  Lines (blank lines and lines starting with '#' are
 * ignored, unknown words are ignored):
 *   stall OP [OP...]   OP among getattr open read flush release statfs;
 *                      any number of such lines
 *   pid N              only requests made by process N stall; several
 *                      pid lines (or several numbers on one line) make a
 *                      set.  Without a pid line, requests from every
 *                      process stall.
 *   interruptible      a stalled request the kernel sends INTERRUPT for
 *                      (its caller got a signal) fails with EINTR.  By
 *                      default INTERRUPT is ignored, like a hung server:
 *                      a signalled caller then sits in state D, unkillable
 *                      even by SIGKILL, until the stall ends.
 *
 * About pids: the kernel gives the server (fuse_get_context()->pid) the id
 * of the calling *thread*, which equals the process id only for a
 * process's main thread.  stallfs maps it to the process id (the Tgid in
 * /proc/TID/status) and uses that in the log, in the status file and for
 * `pid N` (which also matches a bare thread id N).  FLUSH carries the
 * thread that calls close(2) -- also in a process that received the
 * descriptor over a unix socket (SCM_RIGHTS), not the one that opened it.
 * RELEASE has no caller and is logged with pid 0.
 *
 * A request that must stall waits, re-reading the control file every 5 ms,
 * until the control file no longer says to stall it, and is then served
 * normally.  Meanwhile its caller sleeps in the kernel in state S (wchan
 * request_wait_answer), not D; it turns D once it receives a signal.  So
 * wait for the request in CONTROL_FILE.stalled rather than for state D.
 *
 * `stall getattr` never stalls getattr on the root directory "/" nor on a
 * name that is not a regular file in BACKING_DIR, so `ls`/`stat` of the
 * mount point itself keeps working.  Note that the libfuse high-level API
 * implements LOOKUP (path resolution) with the same getattr callback, so
 * with `stall getattr` in force a stalled process also stalls when it
 * resolves a file's path (open(2), stat(2) of FILE); open the file before
 * stalling getattr if only the fstat(2) should stall.  Both show up as
 * "getattr" in the log.
 *
 * Status and log files
 * --------------------
 * CONTROL_FILE.stalled  one line "OP PID" per request currently stalled,
 *                       rewritten atomically (temp file + rename) whenever
 *                       the set changes; created empty at start and empty
 *                       whenever nothing is stalled.
 * CONTROL_FILE.log      one line "OP PID" appended (and flushed) for every
 *                       request, stalled or not, in arrival order; it is
 *                       truncated when stallfs starts and written with
 *                       O_APPEND, so a test may truncate it (`: > FILE`)
 *                       between steps.
 *
 * Releasing stuck processes
 * -------------------------
 * Removing the stall (rewriting CONTROL_FILE) releases them normally.
 * Killing the server (kill -9) closes /dev/fuse: the kernel aborts the
 * connection, every request in flight fails with ECONNABORTED and later
 * ones with ENOTCONN; the dead mount then needs `umount MOUNTPOINT`.
 * Writing 1 to /sys/fs/fuse/connections/N/abort (N = minor device number
 * of the mount, `mountpoint -d MOUNTPOINT`; fusectl must be mounted there)
 * has the same effect and makes stallfs exit.  SIGTERM / SIGINT make
 * libfuse leave its loop: stalled requests notice within 5 ms and fail
 * with EIO, then stallfs unmounts and exits (libfuse takes a second or
 * two).  Unmounting does NOT release anyone while a descriptor is still
 * open on the mount: `fusermount3 -u MOUNTPOINT` fails with EBUSY, and
 * `umount -l` only detaches the mount point -- the connection, and every
 * stalled request, stays until the last descriptor is closed.  So tear
 * down by clearing the control file or killing the server.
 *
 * libfuse 3.14 prints "Ignoring invalid max threads value 4294967295 >
 * max (100000)." at start; that is a harmless libfuse message.
 */

#define FUSE_USE_VERSION 31
#define _GNU_SOURCE

#include <fuse.h>
#include <fuse_lowlevel.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

enum op {
    OP_GETATTR,
    OP_OPEN,
    OP_READ,
    OP_FLUSH,
    OP_RELEASE,
    OP_STATFS,
    OP_COUNT
};

static const char *const op_names[OP_COUNT] = {
    "getattr", "open", "read", "flush", "release", "statfs"
};

#define MAX_PIDS 64

struct control {
    unsigned ops;           /* bit (1 << OP_x) set = stall OP_x */
    int interruptible;      /* "interruptible" line present */
    int npids;              /* 0 = every pid */
    pid_t pids[MAX_PIDS];
};

struct stalled {
    enum op op;
    pid_t pid;
    struct stalled *next;
};

static int backing_fd = -1;
static char *control_path;
static char *stalled_path;
static char *stalled_tmp_path;
static char *log_path;
static FILE *log_file;

static pthread_mutex_t state_lock = PTHREAD_MUTEX_INITIALIZER;
static struct stalled *stalled_list;

/* Cache of the parsed control file, keyed by identity and mtime. */
static pthread_mutex_t control_lock = PTHREAD_MUTEX_INITIALIZER;
static struct control control_cache;
static int control_cache_valid;
static dev_t control_dev;
static ino_t control_ino;
static off_t control_size;
static struct timespec control_mtime;
static struct timespec control_ctime;

/* ------------------------------------------------------------------ */
/* Control file                                                         */

static void parse_control(FILE *f, struct control *c)
{
    char line[4096];

    memset(c, 0, sizeof(*c));
    while (fgets(line, sizeof(line), f) != NULL) {
        char *save = NULL;
        char *word = strtok_r(line, " \t\r\n", &save);

        if (word == NULL || word[0] == '#')
            continue;
        if (strcmp(word, "stall") == 0) {
            while ((word = strtok_r(NULL, " \t\r\n", &save)) != NULL) {
                for (int i = 0; i < OP_COUNT; i++)
                    if (strcmp(word, op_names[i]) == 0)
                        c->ops |= 1u << i;
            }
        } else if (strcmp(word, "interruptible") == 0) {
            c->interruptible = 1;
        } else if (strcmp(word, "pid") == 0) {
            while ((word = strtok_r(NULL, " \t\r\n", &save)) != NULL) {
                char *end;
                long v = strtol(word, &end, 10);

                if (*end == '\0' && end != word && v > 0 && v <= INT_MAX &&
                    c->npids < MAX_PIDS)
                    c->pids[c->npids++] = (pid_t)v;
            }
        }
    }
}

static int same_ts(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec == b->tv_sec && a->tv_nsec == b->tv_nsec;
}

/* Current contents of the control file (empty if it is missing). */
static void read_control(struct control *out)
{
    struct stat st;

    pthread_mutex_lock(&control_lock);
    if (stat(control_path, &st) != 0) {
        memset(out, 0, sizeof(*out));
        control_cache_valid = 0;
        pthread_mutex_unlock(&control_lock);
        return;
    }
    if (!control_cache_valid || st.st_dev != control_dev ||
        st.st_ino != control_ino || st.st_size != control_size ||
        !same_ts(&st.st_mtim, &control_mtime) ||
        !same_ts(&st.st_ctim, &control_ctime)) {
        FILE *f = fopen(control_path, "r");
        struct stat fst;

        if (f == NULL) {
            memset(&control_cache, 0, sizeof(control_cache));
            control_cache_valid = 0;
        } else {
            parse_control(f, &control_cache);
            /* Key the cache by the file actually read. */
            if (fstat(fileno(f), &fst) == 0) {
                control_dev = fst.st_dev;
                control_ino = fst.st_ino;
                control_size = fst.st_size;
                control_mtime = fst.st_mtim;
                control_ctime = fst.st_ctim;
                control_cache_valid = 1;
            } else {
                control_cache_valid = 0;
            }
            fclose(f);
        }
    }
    *out = control_cache;
    pthread_mutex_unlock(&control_lock);
}

static int must_stall(enum op op, pid_t pid, pid_t tid, int *interruptible)
{
    struct control c;

    read_control(&c);
    *interruptible = c.interruptible;
    if (!(c.ops & (1u << op)))
        return 0;
    if (c.npids == 0)
        return 1;
    for (int i = 0; i < c.npids; i++)
        if (c.pids[i] == pid || c.pids[i] == tid)
            return 1;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Status and log files (callers hold state_lock)                       */

static void write_stalled_locked(void)
{
    FILE *f = fopen(stalled_tmp_path, "w");

    if (f == NULL) {
        perror("stallfs: write stalled status");
        return;
    }
    /* Oldest first: the list is kept in arrival order. */
    for (struct stalled *s = stalled_list; s != NULL; s = s->next)
        fprintf(f, "%s %d\n", op_names[s->op], (int)s->pid);
    if (fclose(f) != 0 || rename(stalled_tmp_path, stalled_path) != 0)
        perror("stallfs: write stalled status");
}

static void log_request(enum op op, pid_t pid)
{
    pthread_mutex_lock(&state_lock);
    if (log_file != NULL) {
        fprintf(log_file, "%s %d\n", op_names[op], (int)pid);
        fflush(log_file);
    }
    pthread_mutex_unlock(&state_lock);
}

/*
 * fuse_get_context()->pid is the kernel's id of the calling thread.  Map it
 * to its process (thread group) id through /proc so that a close(2) on any
 * thread of a multithreaded daemon is reported and matched as that
 * daemon's pid.  Falls back to the thread id (e.g. 0 for RELEASE, or a
 * thread that is already gone).
 */
static pid_t process_of(pid_t tid)
{
    char path[64], line[256];
    pid_t pid = tid;
    FILE *f;

    if (tid <= 0)
        return tid;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)tid);
    f = fopen(path, "re");
    if (f == NULL)
        return tid;
    while (fgets(line, sizeof(line), f) != NULL) {
        int v;

        if (sscanf(line, "Tgid: %d", &v) == 1) {
            if (v > 0)
                pid = (pid_t)v;
            break;
        }
    }
    fclose(f);
    return pid;
}

static int session_exited(void)
{
    struct fuse_context *ctx = fuse_get_context();

    return ctx != NULL && ctx->fuse != NULL &&
           fuse_session_exited(fuse_get_session(ctx->fuse));
}

/*
 * Log the request, then wait while the control file says to stall it.
 * Returns 0 to go on serving it, or a negative errno to fail it (the file
 * system is shutting down, or, with "interruptible", the kernel sent
 * INTERRUPT for it).
 */
static int gate(enum op op)
{
    pid_t tid = fuse_get_context()->pid;
    pid_t pid = process_of(tid);
    struct stalled *me;
    struct stalled **pp;
    int interruptible;
    int ret = 0;

    log_request(op, pid);
    if (!must_stall(op, pid, tid, &interruptible))
        return 0;

    me = calloc(1, sizeof(*me));
    if (me == NULL)
        return -ENOMEM;
    me->op = op;
    me->pid = pid;

    pthread_mutex_lock(&state_lock);
    for (pp = &stalled_list; *pp != NULL; pp = &(*pp)->next)
        ;
    *pp = me;
    write_stalled_locked();
    pthread_mutex_unlock(&state_lock);

    for (;;) {
        struct timespec ts = { 0, 5 * 1000 * 1000 };

        if (!must_stall(op, pid, tid, &interruptible))
            break;
        if (session_exited()) {
            ret = -EIO;
            break;
        }
        if (interruptible && fuse_interrupted()) {
            ret = -EINTR;
            break;
        }
        nanosleep(&ts, NULL);
    }

    pthread_mutex_lock(&state_lock);
    for (pp = &stalled_list; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == me) {
            *pp = me->next;
            break;
        }
    }
    write_stalled_locked();
    pthread_mutex_unlock(&state_lock);
    free(me);
    return ret;
}

/* ------------------------------------------------------------------ */
/* File system                                                          */

/* "/name" -> "name" if it is a flat name, else NULL. */
static const char *flat_name(const char *path)
{
    if (path == NULL || path[0] != '/' || path[1] == '\0')
        return NULL;
    if (strchr(path + 1, '/') != NULL)
        return NULL;
    if (strcmp(path + 1, ".") == 0 || strcmp(path + 1, "..") == 0)
        return NULL;
    return path + 1;
}

static int backing_stat(const char *path, struct stat *st)
{
    const char *name = flat_name(path);

    if (name == NULL)
        return -ENOENT;
    if (fstatat(backing_fd, name, st, 0) != 0)
        return -errno;
    if (!S_ISREG(st->st_mode))
        return -ENOENT;
    return 0;
}

static void fill_file_stat(struct stat *st)
{
    st->st_mode = S_IFREG | 0444;
    st->st_nlink = 1;
}

static void *sfs_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
    (void)conn;
    cfg->attr_timeout = 0;
    cfg->entry_timeout = 0;
    cfg->negative_timeout = 0;
    cfg->direct_io = 1;
    cfg->kernel_cache = 0;
    cfg->auto_cache = 0;
    return NULL;
}

static int sfs_getattr(const char *path, struct stat *st,
                       struct fuse_file_info *fi)
{
    struct stat bst;
    int res;

    if (path != NULL && strcmp(path, "/") == 0) {
        struct stat dst;

        memset(st, 0, sizeof(*st));
        if (fstat(backing_fd, &dst) == 0) {
            st->st_uid = dst.st_uid;
            st->st_gid = dst.st_gid;
            st->st_atim = dst.st_atim;
            st->st_mtim = dst.st_mtim;
            st->st_ctim = dst.st_ctim;
        }
        st->st_mode = S_IFDIR | 0555;
        st->st_nlink = 2;
        return 0;
    }

    if (fi != NULL) {
        /* getattr on an open file (FUSE_GETATTR_FH). */
        res = gate(OP_GETATTR);
        if (res != 0)
            return res;
        if (fstat((int)fi->fh, &bst) != 0)
            return -errno;
    } else {
        /* Names that are not regular files are never stalled. */
        res = backing_stat(path, &bst);
        if (res != 0)
            return res;
        res = gate(OP_GETATTR);
        if (res != 0)
            return res;
        /* Re-check: the backing file may have changed while stalled. */
        res = backing_stat(path, &bst);
        if (res != 0)
            return res;
    }
    *st = bst;
    fill_file_stat(st);
    return 0;
}

static int sfs_readdir(const char *path, void *buf, fuse_fill_dir_t filler,
                       off_t offset, struct fuse_file_info *fi,
                       enum fuse_readdir_flags flags)
{
    DIR *dir;
    struct dirent *de;
    int fd;

    (void)offset;
    (void)fi;
    (void)flags;
    if (strcmp(path, "/") != 0)
        return -ENOENT;

    fd = openat(backing_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    dir = fdopendir(fd);
    if (dir == NULL) {
        int e = errno;

        close(fd);
        return -e;
    }
    filler(buf, ".", NULL, 0, 0);
    filler(buf, "..", NULL, 0, 0);
    while ((de = readdir(dir)) != NULL) {
        struct stat st;

        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (fstatat(backing_fd, de->d_name, &st, 0) != 0 ||
            !S_ISREG(st.st_mode))
            continue;
        fill_file_stat(&st);
        if (filler(buf, de->d_name, &st, 0, 0) != 0)
            break;
    }
    closedir(dir);
    return 0;
}

static int sfs_open(const char *path, struct fuse_file_info *fi)
{
    const char *name = flat_name(path);
    int res, fd;

    if (name == NULL)
        return -ENOENT;
    if ((fi->flags & O_ACCMODE) != O_RDONLY)
        return -EACCES;
    res = gate(OP_OPEN);
    if (res != 0)
        return res;
    fd = openat(backing_fd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    fi->fh = (uint64_t)fd;
    fi->direct_io = 1;
    fi->keep_cache = 0;
    /* fi->noflush stays 0: every close(2) must send FLUSH. */
    return 0;
}

static int sfs_read(const char *path, char *buf, size_t size, off_t offset,
                    struct fuse_file_info *fi)
{
    size_t done = 0;
    int res;

    (void)path;
    res = gate(OP_READ);
    if (res != 0)
        return res;
    while (done < size) {
        ssize_t n = pread((int)fi->fh, buf + done, size - done,
                          offset + (off_t)done);

        if (n < 0) {
            if (errno == EINTR)
                continue;
            return done > 0 ? (int)done : -errno;
        }
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return (int)done;
}

static int sfs_flush(const char *path, struct fuse_file_info *fi)
{
    (void)path;
    (void)fi;
    return gate(OP_FLUSH);
}

static int sfs_release(const char *path, struct fuse_file_info *fi)
{
    (void)path;
    /* The kernel ignores the result; always close the backing file. */
    gate(OP_RELEASE);
    close((int)fi->fh);
    return 0;
}

static int sfs_statfs(const char *path, struct statvfs *sv)
{
    int res;

    (void)path;
    res = gate(OP_STATFS);
    if (res != 0)
        return res;
    if (fstatvfs(backing_fd, sv) != 0)
        return -errno;
    return 0;
}

static const struct fuse_operations sfs_ops = {
    .init = sfs_init,
    .getattr = sfs_getattr,
    .readdir = sfs_readdir,
    .open = sfs_open,
    .read = sfs_read,
    .flush = sfs_flush,
    .release = sfs_release,
    .statfs = sfs_statfs,
};

/* ------------------------------------------------------------------ */

static char *concat(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);

    if (s == NULL) {
        perror("stallfs");
        exit(1);
    }
    memcpy(s, a, la);
    memcpy(s + la, b, lb + 1);
    return s;
}

int main(int argc, char *argv[])
{
    char **fargv;
    int fargc = 0;
    int log_fd;
    int res;

    if (argc < 4) {
        fprintf(stderr,
                "usage: %s BACKING_DIR CONTROL_FILE MOUNTPOINT "
                "[fuse options]\n",
                argv[0]);
        return 2;
    }

    backing_fd = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (backing_fd < 0) {
        fprintf(stderr, "stallfs: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }

    /* Absolute control path: libfuse may chdir("/") in some setups. */
    if (argv[2][0] == '/') {
        control_path = strdup(argv[2]);
    } else {
        char cwd[PATH_MAX];

        if (getcwd(cwd, sizeof(cwd)) == NULL) {
            perror("stallfs: getcwd");
            return 1;
        }
        control_path = concat(concat(cwd, "/"), argv[2]);
    }
    if (control_path == NULL) {
        perror("stallfs");
        return 1;
    }
    stalled_path = concat(control_path, ".stalled");
    stalled_tmp_path = concat(control_path, ".stalled.tmp");
    log_path = concat(control_path, ".log");

    /* O_APPEND, so a test may truncate the log between steps. */
    log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC,
                  0644);
    if (log_fd < 0 || (log_file = fdopen(log_fd, "a")) == NULL) {
        fprintf(stderr, "stallfs: %s: %s\n", log_path, strerror(errno));
        return 1;
    }
    pthread_mutex_lock(&state_lock);
    write_stalled_locked();
    pthread_mutex_unlock(&state_lock);

    /* argv[0], -f, -o max_threads=256, MOUNTPOINT, user options, NULL. */
    fargv = calloc((size_t)argc + 4, sizeof(*fargv));
    if (fargv == NULL) {
        perror("stallfs");
        return 1;
    }
    fargv[fargc++] = argv[0];
    fargv[fargc++] = "-f";
    fargv[fargc++] = "-omax_threads=256";
    fargv[fargc++] = argv[3];
    for (int i = 4; i < argc; i++)
        fargv[fargc++] = argv[i];
    fargv[fargc] = NULL;

    res = fuse_main(fargc, fargv, &sfs_ops, NULL);

    pthread_mutex_lock(&state_lock);
    fclose(log_file);
    log_file = NULL;
    pthread_mutex_unlock(&state_lock);
    free(fargv);
    close(backing_fd);
    return res;
}
