// The C side of the sd-bus interop: libsystemd's headers plus static inline helpers for
// what Swift cannot reach directly (vtable macros, variadic calls). Plain Linux calls are
// CLinux's, wrapped in SystemCalls.
#ifndef DRAGBROKER_CSYSTEMD_SHIM_H
#define DRAGBROKER_CSYSTEMD_SHIM_H

/* No _GNU_SOURCE here: it changes glibc's struct layouts (fd_set's field names) and Clang
 * then refuses to merge them with the same structs seen by Glibc, Dispatch and System. */
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
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
static inline uint64_t shim_vtable_flag_property_emits_invalidation(void) { return SD_BUS_VTABLE_PROPERTY_EMITS_INVALIDATION; }

static inline uint64_t shim_creds_pid_euid_unique(void) {
    return SD_BUS_CREDS_PID | SD_BUS_CREDS_EUID | SD_BUS_CREDS_UNIQUE_NAME;
}

static inline int shim_bus_error_set(sd_bus_error *e, const char *name, const char *message) {
    return sd_bus_error_set(e, name, message);
}

static inline int shim_notify(const char *state) { return sd_notify(0, state); }

static inline int shim_journal_sendv(const struct iovec *iov, int n) { return sd_journal_sendv(iov, n); }

static inline uint32_t shim_epollin(void) { return EPOLLIN; }
static inline uint32_t shim_epollout(void) { return EPOLLOUT; }

#endif
