// The C side of the interop: libsystemd's headers plus static inline helpers for
// what Swift cannot reach directly (vtable macros, variadic calls, errno, splice).
#ifndef DRAGBROKER_CSYSTEMD_SHIM_H
#define DRAGBROKER_CSYSTEMD_SHIM_H

/* No _GNU_SOURCE here: it changes glibc's struct layouts (fd_set's field names) and Clang
 * then refuses to merge them with the same structs seen by Glibc, Dispatch and System.
 * The Linux-only calls below go through syscall(2) instead. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <systemd/sd-bus.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>
#include <systemd/sd-journal.h>
#include <sys/uio.h>

static inline sd_bus_vtable shim_vtable_start(uint64_t flags) {
    sd_bus_vtable v;
    memset(&v, 0, sizeof v);
    v.type = _SD_BUS_VTABLE_START;
    v.flags = flags;
    v.x.start.element_size = sizeof(sd_bus_vtable);
    v.x.start.features = _SD_BUS_VTABLE_PARAM_NAMES;
    /* Without this reference sd-bus treats the table as an old format and drops the names. */
    v.x.start.vtable_format_reference = &sd_bus_object_vtable_format;
    return v;
}

static inline sd_bus_vtable shim_vtable_method(const char *member, const char *signature,
                                               const char *result, const char *names,
                                               sd_bus_message_handler_t handler, uint64_t flags) {
    sd_bus_vtable v;
    memset(&v, 0, sizeof v);
    v.type = _SD_BUS_VTABLE_METHOD;
    v.flags = flags;
    v.x.method.member = member;
    v.x.method.signature = signature;
    v.x.method.result = result;
    v.x.method.handler = handler;
    v.x.method.offset = 0;
    v.x.method.names = names;
    return v;
}

static inline sd_bus_vtable shim_vtable_signal(const char *member, const char *signature,
                                               const char *names, uint64_t flags) {
    sd_bus_vtable v;
    memset(&v, 0, sizeof v);
    v.type = _SD_BUS_VTABLE_SIGNAL;
    v.flags = flags;
    v.x.signal.member = member;
    v.x.signal.signature = signature;
    v.x.signal.names = names;
    return v;
}

static inline sd_bus_vtable shim_vtable_property(const char *member, const char *signature,
                                                 sd_bus_property_get_t get, uint64_t flags) {
    sd_bus_vtable v;
    memset(&v, 0, sizeof v);
    v.type = _SD_BUS_VTABLE_PROPERTY;
    v.flags = flags;
    v.x.property.member = member;
    v.x.property.signature = signature;
    v.x.property.get = get;
    v.x.property.set = NULL;
    v.x.property.offset = 0;
    return v;
}

static inline sd_bus_vtable shim_vtable_end(void) {
    sd_bus_vtable v;
    memset(&v, 0, sizeof v);
    v.type = _SD_BUS_VTABLE_END;
    return v;
}

static inline uint64_t shim_vtable_flag_unprivileged(void) { return SD_BUS_VTABLE_UNPRIVILEGED; }
static inline uint64_t shim_vtable_flag_property_const(void) { return SD_BUS_VTABLE_PROPERTY_CONST; }
static inline uint64_t shim_vtable_flag_property_emits_change(void) { return SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE; }

static inline uint64_t shim_creds_pid_euid_unique(void) {
    return SD_BUS_CREDS_PID | SD_BUS_CREDS_EUID | SD_BUS_CREDS_UNIQUE_NAME;
}

static inline int shim_bus_error_set(sd_bus_error *e, const char *name, const char *message) {
    return sd_bus_error_set(e, name, message);
}

static inline int shim_notify(const char *state) { return sd_notify(0, state); }

static inline int shim_pipe(int fds[2]) { return (int)syscall(SYS_pipe2, fds, O_CLOEXEC | O_NONBLOCK); }
static inline int shim_pipe_blocking(int fds[2]) { return (int)syscall(SYS_pipe2, fds, O_CLOEXEC); }

/* F_SETPIPE_SZ / F_GETPIPE_SZ: F_LINUX_SPECIFIC_BASE (1024) + 7 / + 8. */
static inline int shim_set_pipe_size(int fd, int size) { return fcntl(fd, 1024 + 7, size); }
static inline int shim_get_pipe_size(int fd) { return fcntl(fd, 1024 + 8); }

static inline int shim_dupfd_cloexec(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 3); }

/* SPLICE_F_MOVE (1) | SPLICE_F_NONBLOCK (2) */
static inline ssize_t shim_splice(int in, int out, size_t len) {
    return (ssize_t)syscall(SYS_splice, in, NULL, out, NULL, len, 1u | 2u);
}

/* Bytes waiting in a pipe (FIONREAD), or -1. */
static inline int shim_pending_bytes(int fd) {
    int n = 0;
    return ioctl(fd, FIONREAD, &n) < 0 ? -1 : n;
}

/* F_GET_SEALS (F_LINUX_SPECIFIC_BASE + 10) and the seals, from linux/fcntl.h. */
static inline int shim_get_seals(int fd) { return fcntl(fd, 1024 + 10); }
static inline int shim_seal_shrink(void) { return 0x0002; }
static inline int shim_seal_grow(void) { return 0x0004; }
static inline int shim_seal_write(void) { return 0x0008; }

/* F_ADD_SEALS with F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE */
static inline int shim_seal_all(int fd) { return fcntl(fd, 1024 + 9, 0x1 | 0x2 | 0x4 | 0x8); }

static inline int shim_journal_sendv(const struct iovec *iov, int n) { return sd_journal_sendv(iov, n); }

static inline ssize_t shim_getrandom(void *buf, size_t len) { return getrandom(buf, len, 0); }

static inline int shim_pidfd_open(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

static inline void shim_ignore_sigpipe(void) { signal(SIGPIPE, SIG_IGN); }

static inline uint32_t shim_epollin(void) { return EPOLLIN; }
static inline uint32_t shim_epollout(void) { return EPOLLOUT; }

#endif
