/* A drag source on the binding gdbus-codegen generates from the shipped XML.
 *
 *   dragbroker-source KIND TYPE FILE
 *
 * Offers FILE's bytes as one item (named after FILE) with one representation of TYPE,
 * KIND "data" (streamed through a pipe) or "file" (handed over as a sealed memfd),
 * prints the session's token for a destination, and serves the provider until the
 * broker says the transfer is finished. The bus is the session bus
 * (DBUS_SESSION_BUS_ADDRESS). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gio/gio.h>
#include <gio/gunixfdlist.h>

#include "dragbroker-errors.h"
#include "dragbroker-generated.h"

#define BROKER_NAME "org.dragbroker.Broker1"
#define MANAGER_PATH "/org/dragbroker/Broker1"
/* Any path on our own connection will do; BeginSession tells the broker which. */
#define PROVIDER_PATH "/org/dragbroker/Provider1/c"

typedef struct {
  const gchar *name;
  gchar *bytes;
  gsize size;
  GMainLoop *loop;
  int status;
  /* Who may ask for the bytes: the broker's unique name, for the session we began. */
  gchar *broker;
  gchar *session_path;
} Source;

/* Any peer on the bus can call an exported object: only the broker, for our session, is served. */
static gboolean
refuse_unless_broker (Source *source, GDBusMethodInvocation *invocation, const gchar *session)
{
  if (source->broker != NULL && g_strcmp0 (g_dbus_method_invocation_get_sender (invocation), source->broker) == 0
      && g_strcmp0 (session, source->session_path) == 0)
    return FALSE;
  g_dbus_method_invocation_return_error (invocation, DRAGBROKER_ERROR, DRAGBROKER_ERROR_ACCESS_DENIED,
                                         "Only dragbrokerd may request data from this provider");
  return TRUE;
}

static gboolean
write_all (int fd, const gchar *bytes, gsize size, GError **error)
{
  while (size > 0)
    {
      ssize_t written = write (fd, bytes, size);
      if (written < 0)
        {
          if (errno == EINTR)
            continue;
          g_set_error (error, G_IO_ERROR, g_io_error_from_errno (errno), "write: %s", g_strerror (errno));
          return FALSE;
        }
      bytes += written;
      size -= (gsize) written;
    }
  return TRUE;
}

static gboolean
on_provide (DragBrokerProvider1 *provider, GDBusMethodInvocation *invocation, GUnixFDList *fd_list,
            const gchar *session, guint item, const gchar *type, guint load, GVariant *data, gpointer user_data)
{
  Source *source = user_data;
  GError *error = NULL;
  int fd;

  if (refuse_unless_broker (source, invocation, session))
    return TRUE;
  printf ("source: provide item %u as %s (load %u)\n", item, type, load);
  if (fd_list == NULL)
    {
      g_dbus_method_invocation_return_error (invocation, DRAGBROKER_ERROR, DRAGBROKER_ERROR_INVALID_ARGUMENT,
                                             "Provide carried no descriptor");
      return TRUE;
    }
  /* A duplicate: the original stays in the call's message until the call is freed, which
   * is why the broker takes our reply, not end of file, as the end of the data. */
  fd = g_unix_fd_list_get (fd_list, g_variant_get_handle (data), &error);
  /* Blocking is fine here: the broker drains the pipe from its own event loop. An app with
   * a user interface writes from a thread and completes the call from there. */
  if (fd < 0 || !write_all (fd, source->bytes, source->size, &error))
    {
      if (fd >= 0)
        close (fd);
      /* With the error domain registered, the reply carries the broker's error name. */
      g_dbus_method_invocation_return_error (invocation, DRAGBROKER_ERROR, DRAGBROKER_ERROR_FAILED,
                                             "%s", error->message);
      g_error_free (error);
      return TRUE;
    }
  close (fd);
  /* Every byte is in the pipe: the reply ends the data. Nothing may be written after it. */
  drag_broker_provider1_complete_provide (provider, invocation, NULL);
  return TRUE;
}

static gboolean
on_provide_file (DragBrokerProvider1 *provider, GDBusMethodInvocation *invocation, GUnixFDList *fd_list,
                 const gchar *session, guint item, const gchar *type, guint load, gpointer user_data)
{
  Source *source = user_data;
  GError *error = NULL;
  GUnixFDList *reply_fds;
  int fd;

  (void) fd_list;
  if (refuse_unless_broker (source, invocation, session))
    return TRUE;
  printf ("source: provide item %u as a file of %s (load %u)\n", item, type, load);
  /* The broker accepts a regular file opened read-only, or a memfd that can no longer
   * change: what the destination reads is then exactly what we offered. */
  fd = memfd_create (source->name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || !write_all (fd, source->bytes, source->size, &error)
      || fcntl (fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0)
    {
      g_dbus_method_invocation_return_error (invocation, DRAGBROKER_ERROR, DRAGBROKER_ERROR_FAILED,
                                             "Cannot make the sealed file: %s",
                                             error != NULL ? error->message : g_strerror (errno));
      g_clear_error (&error);
      if (fd >= 0)
        close (fd);
      return TRUE;
    }
  reply_fds = g_unix_fd_list_new_from_array (&fd, 1); /* takes fd */
  drag_broker_provider1_complete_provide_file (provider, invocation, reply_fds, g_variant_new_handle (0));
  g_object_unref (reply_fds);
  return TRUE;
}

static void
on_will_end (DragBrokerBroker1Session *session, const gchar *operation, gpointer user_data)
{
  (void) session;
  (void) user_data;
  printf ("source: WillEnd %s\n", operation);
}

static void
on_load_finished (DragBrokerBroker1Session *session, guint load, guint64 bytes, const gchar *error,
                  const gchar *message, gpointer user_data)
{
  (void) session;
  (void) user_data;
  if (*error == '\0')
    printf ("source: LoadFinished %u %" G_GUINT64_FORMAT "\n", load, bytes);
  else
    printf ("source: LoadFinished %u %" G_GUINT64_FORMAT " %s %s\n", load, bytes, error, message);
}

static void
on_ended (DragBrokerBroker1Session *session, const gchar *operation, const gchar *error, const gchar *message,
          gpointer user_data)
{
  Source *source = user_data;

  (void) session;
  if (*error == '\0')
    {
      /* TransferFinished follows once every load is done. */
      printf ("source: Ended %s\n", operation);
      return;
    }
  printf ("source: Ended %s %s %s\n", operation, error, message);
  source->status = 1;
  g_main_loop_quit (source->loop);
}

static void
on_transfer_finished (DragBrokerBroker1Session *session, gpointer user_data)
{
  Source *source = user_data;

  (void) session;
  printf ("source: TransferFinished\n");
  g_main_loop_quit (source->loop);
}

static gboolean
on_timeout (gpointer user_data)
{
  Source *source = user_data;

  fprintf (stderr, "source: no TransferFinished within 30 s\n");
  source->status = 1;
  g_main_loop_quit (source->loop);
  return G_SOURCE_REMOVE;
}

static int
fail (const gchar *what, GError *error)
{
  fprintf (stderr, "source: %s: %s\n", what, error->message);
  g_error_free (error);
  return 1;
}

int
main (int argc, char **argv)
{
  Source source = { 0 };
  GError *error = NULL;
  GDBusConnection *bus;
  DragBrokerProvider1 *provider;
  DragBrokerBroker1Manager *manager;
  DragBrokerBroker1Session *session;
  gchar *name, *path = NULL, *token = NULL;
  GVariant *items;

  if (argc != 4 || (strcmp (argv[1], "data") != 0 && strcmp (argv[1], "file") != 0))
    {
      fprintf (stderr, "usage: %s data|file TYPE FILE\n", argv[0]);
      return 2;
    }
  /* Lines reach whoever reads them (a destination waiting for the token) at once. */
  setvbuf (stdout, NULL, _IOLBF, 0);
  /* A load the broker ends early closes the pipe: write then fails with EPIPE instead. */
  signal (SIGPIPE, SIG_IGN);
  dragbroker_error_quark ();

  if (!g_file_get_contents (argv[3], &source.bytes, &source.size, &error))
    return fail ("reading the file", error);
  name = g_path_get_basename (argv[3]);
  source.name = name;

  bus = g_bus_get_sync (G_BUS_TYPE_SESSION, NULL, &error);
  if (bus == NULL)
    return fail ("connecting to the session bus", error);

  /* Exported before the drag begins: the broker may call it as soon as a destination drops. */
  provider = drag_broker_provider1_skeleton_new ();
  g_signal_connect (provider, "handle-provide", G_CALLBACK (on_provide), &source);
  g_signal_connect (provider, "handle-provide-file", G_CALLBACK (on_provide_file), &source);
  if (!g_dbus_interface_skeleton_export (G_DBUS_INTERFACE_SKELETON (provider), bus, PROVIDER_PATH, &error))
    return fail ("exporting the provider", error);

  manager = drag_broker_broker1_manager_proxy_new_sync (bus, G_DBUS_PROXY_FLAGS_DO_NOT_LOAD_PROPERTIES, BROKER_NAME,
                                                        MANAGER_PATH, NULL, &error);
  if (manager == NULL)
    return fail ("reaching the broker", error);
  source.broker = g_dbus_proxy_get_name_owner (G_DBUS_PROXY (manager));
  /* a(sdda(sss)): (suggested name, preferred width, height (0: none), [(type, visibility, kind)]). */
  items = g_variant_new_parsed ("[(%s, 0.0, 0.0, [(%s, 'all', %s)])]", name, argv[2], argv[1]);
  if (!drag_broker_broker1_manager_call_begin_session_sync (manager, items, g_variant_new_parsed ("@a{sv} {}"),
                                                             PROVIDER_PATH, &path, &token, NULL, &error))
    return fail ("BeginSession", error);
  source.session_path = path;

  /* Subscribed before the token leaves this process, so no signal can come first. */
  session = drag_broker_broker1_session_proxy_new_sync (bus, G_DBUS_PROXY_FLAGS_DO_NOT_LOAD_PROPERTIES, BROKER_NAME,
                                                        path, NULL, &error);
  if (session == NULL)
    return fail ("reaching the session", error);
  source.loop = g_main_loop_new (NULL, FALSE);
  g_signal_connect (session, "will-end", G_CALLBACK (on_will_end), &source);
  g_signal_connect (session, "load-finished", G_CALLBACK (on_load_finished), &source);
  g_signal_connect (session, "ended", G_CALLBACK (on_ended), &source);
  g_signal_connect (session, "transfer-finished", G_CALLBACK (on_transfer_finished), &source);

  printf ("source: began %s\n", path);
  /* What the windowing system's drag would carry to the destination. */
  printf ("source: token %s\n", token);

  g_timeout_add_seconds (30, on_timeout, &source);
  g_main_loop_run (source.loop);

  g_dbus_interface_skeleton_unexport (G_DBUS_INTERFACE_SKELETON (provider));
  g_main_loop_unref (source.loop);
  g_object_unref (session);
  g_object_unref (manager);
  g_object_unref (provider);
  g_object_unref (bus);
  g_free (path);
  g_free (source.broker);
  g_free (token);
  g_free (name);
  g_free (source.bytes);
  return source.status;
}
