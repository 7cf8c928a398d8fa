// The Linux calls Swift cannot reach directly: variadic fcntl/ioctl forms, syscalls glibc
// does not wrap without _GNU_SOURCE, and errno. Only Sources/SystemCalls uses this module.
#ifndef DRAGBROKER_CLINUX_H
#define DRAGBROKER_CLINUX_H

/* No _GNU_SOURCE: it changes glibc's struct layouts (fd_set's field names) and Clang then
 * refuses to merge them with the same structs seen by Glibc, Dispatch and System. The
 * Linux-only calls go through syscall(2) instead, with their constants from the kernel's
 * uapi headers spelled out. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

static inline int linux_errno(void) { return errno; }

/* prctl is variadic. The kernel keeps 15 bytes of the name. */
static inline int linux_set_thread_name(const char *name) { return prctl(PR_SET_NAME, name, 0, 0, 0); }
static inline int linux_gettid(void) { return (int)syscall(SYS_gettid); }

/* Swift sees `flock` as fcntl's struct, not the call. */
static inline int linux_flock_exclusive(int fd) { return flock(fd, LOCK_EX | LOCK_NB); }

static inline int linux_pipe2(int fds[2], int nonblocking) {
    return (int)syscall(SYS_pipe2, fds, O_CLOEXEC | (nonblocking ? O_NONBLOCK : 0));
}

/* SPLICE_F_MOVE (1), and SPLICE_F_NONBLOCK (2) when `nonblocking`. */
static inline ssize_t linux_splice(int in, int out, size_t len, int nonblocking) {
    return (ssize_t)syscall(SYS_splice, in, NULL, out, NULL, len, 1u | (nonblocking ? 2u : 0u));
}

/* F_SETPIPE_SZ / F_GETPIPE_SZ: F_LINUX_SPECIFIC_BASE (1024) + 7 / + 8. */
static inline int linux_set_pipe_size(int fd, int size) { return fcntl(fd, 1024 + 7, size); }
static inline int linux_get_pipe_size(int fd) { return fcntl(fd, 1024 + 8); }

static inline int linux_get_flags(int fd) { return fcntl(fd, F_GETFL); }
/* O_PATH (010000000 on every Linux architecture but alpha, parisc and sparc). */
static inline int linux_o_path(void) { return 010000000; }
/* dup3(old, new, O_CLOEXEC): puts `old`'s file at number `new`, closing what was there. */
static inline int linux_dup3_cloexec(int old, int new_fd) { return dup3(old, new_fd, O_CLOEXEC); }
static inline int linux_dupfd_cloexec(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 3); }

/* Bytes waiting in a pipe or socket. */
static inline int linux_pending_bytes(int fd, int *count) { return ioctl(fd, FIONREAD, count); }

/* F_ADD_SEALS / F_GET_SEALS: F_LINUX_SPECIFIC_BASE + 9 / + 10; the seals are plain bits. */
static inline int linux_add_seals(int fd, int seals) { return fcntl(fd, 1024 + 9, seals); }
static inline int linux_get_seals(int fd) { return fcntl(fd, 1024 + 10); }

/* memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING) */
static inline int linux_memfd_create(const char *name) { return (int)syscall(SYS_memfd_create, name, 0x1u | 0x2u); }

static inline int linux_eventfd(void) { return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK); }

static inline ssize_t linux_getrandom(void *buf, size_t len) { return getrandom(buf, len, 0); }

static inline int linux_pidfd_open(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

static inline void linux_ignore_sigpipe(void) { signal(SIGPIPE, SIG_IGN); }

#endif
