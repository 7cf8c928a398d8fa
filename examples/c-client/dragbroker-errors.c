#include "dragbroker-errors.h"

static const GDBusErrorEntry dragbroker_error_entries[] = {
  { DRAGBROKER_ERROR_ACCESS_DENIED, "org.dragbroker.Broker1.Error.AccessDenied" },
  { DRAGBROKER_ERROR_NOT_FOUND, "org.dragbroker.Broker1.Error.NotFound" },
  { DRAGBROKER_ERROR_INVALID_ARGUMENT, "org.dragbroker.Broker1.Error.InvalidArgument" },
  { DRAGBROKER_ERROR_WRONG_STATE, "org.dragbroker.Broker1.Error.WrongState" },
  { DRAGBROKER_ERROR_LIMIT_EXCEEDED, "org.dragbroker.Broker1.Error.LimitExceeded" },
  { DRAGBROKER_ERROR_TIMEOUT, "org.dragbroker.Broker1.Error.Timeout" },
  { DRAGBROKER_ERROR_CANCELLED, "org.dragbroker.Broker1.Error.Cancelled" },
  { DRAGBROKER_ERROR_DISCONNECTED, "org.dragbroker.Broker1.Error.Disconnected" },
  { DRAGBROKER_ERROR_PROVIDER_FAILED, "org.dragbroker.Broker1.Error.ProviderFailed" },
  { DRAGBROKER_ERROR_FAILED, "org.dragbroker.Broker1.Error.Failed" },
};

G_STATIC_ASSERT (G_N_ELEMENTS (dragbroker_error_entries) == DRAGBROKER_N_ERRORS);

GQuark
dragbroker_error_quark (void)
{
  static gsize quark = 0;
  /* Registers once, thread-safely; from then on GDBus builds DRAGBROKER_ERROR
   * errors from these names, and a provider's error reply gets its name back. */
  g_dbus_error_register_error_domain ("dragbroker-error-quark", &quark, dragbroker_error_entries,
                                      G_N_ELEMENTS (dragbroker_error_entries));
  return (GQuark) quark;
}
