/* The broker's D-Bus errors as a GLib error domain.
 *
 * GDBus turns an error reply into a GError. Without a registered domain it is
 * G_IO_ERROR_DBUS_ERROR with the name only inside the message; with this table
 * g_error_matches (error, DRAGBROKER_ERROR, DRAGBROKER_ERROR_WRONG_STATE) works.
 * The codes follow the annotation org.dragbroker.Broker1.Errors in the interface
 * XML, whose order only ever grows at the end.
 *
 * GDBus consults the table when an error reply arrives, so call
 * dragbroker_error_quark () once at start-up, before the first call that may fail:
 * an error that arrived earlier stays in G_IO_ERROR. */
#pragma once

#include <gio/gio.h>

G_BEGIN_DECLS

typedef enum {
  DRAGBROKER_ERROR_ACCESS_DENIED,
  DRAGBROKER_ERROR_NOT_FOUND,
  DRAGBROKER_ERROR_INVALID_ARGUMENT,
  DRAGBROKER_ERROR_WRONG_STATE,
  DRAGBROKER_ERROR_LIMIT_EXCEEDED,
  DRAGBROKER_ERROR_TIMEOUT,
  DRAGBROKER_ERROR_CANCELLED,
  DRAGBROKER_ERROR_DISCONNECTED,
  DRAGBROKER_ERROR_PROVIDER_FAILED,
  DRAGBROKER_ERROR_FAILED,
  DRAGBROKER_N_ERRORS
} DragbrokerError;

#define DRAGBROKER_ERROR (dragbroker_error_quark ())

GQuark dragbroker_error_quark (void);

G_END_DECLS
