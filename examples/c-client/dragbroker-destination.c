/* A drop destination on the binding gdbus-codegen generates from the shipped XML.
 *
 *   dragbroker-destination TOKEN TYPE OUTPUT
 *
 * Joins the drag TOKEN names, drops with a copy, loads item 0 as TYPE, writes the bytes
 * to OUTPUT, waits until the broker says whether every byte arrived, and concludes.
 * The bus is the session bus (DBUS_SESSION_BUS_ADDRESS). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <gio/gio.h>
#include <gio/gunixfdlist.h>

#include "dragbroker-errors.h"
#include "dragbroker-generated.h"

#define BROKER_NAME "org.dragbroker.Broker1"
#define MANAGER_PATH "/org/dragbroker/Broker1"

typedef struct {
  GMainLoop *loop;
  guint load;
  gboolean finished;
  guint64 bytes;
  gchar *error;
  gchar *message;
  guint timeout;
} Finish;

static void
on_load_finished (DragBrokerBroker1Session *session, guint load, guint64 bytes, const gchar *error,
                  const gchar *message, gpointer user_data)
{
  Finish *finish = user_data;

  (void) session;
  if (load != finish->load || finish->finished)
    return;
  finish->finished = TRUE;
  finish->bytes = bytes;
  finish->error = g_strdup (error);
  finish->message = g_strdup (message);
  g_main_loop_quit (finish->loop);
}

static gboolean
on_timeout (gpointer user_data)
{
  Finish *finish = user_data;

  finish->timeout = 0;
  g_main_loop_quit (finish->loop);
  return G_SOURCE_REMOVE;
}

/* Reads to end of file: a data load's pipe ends once the source replied and every byte
 * passed; a file load's descriptor is the source's file, read-only, at offset 0. */
static GByteArray *
read_all (int fd, GError **error)
{
  GByteArray *bytes = g_byte_array_new ();
  guint8 chunk[65536];

  for (;;)
    {
      ssize_t count = read (fd, chunk, sizeof chunk);
      if (count == 0)
        return bytes;
      if (count < 0)
        {
          if (errno == EINTR)
            continue;
          g_set_error (error, G_IO_ERROR, g_io_error_from_errno (errno), "read: %s", g_strerror (errno));
          g_byte_array_unref (bytes);
          return NULL;
        }
      g_byte_array_append (bytes, chunk, (guint) count);
    }
}

static int
fail (const gchar *what, GError *error)
{
  fprintf (stderr, "destination: %s: %s\n", what, error->message);
  g_error_free (error);
  return 1;
}

int
main (int argc, char **argv)
{
  const gchar *token, *type, *output;
  Finish finish = { 0 };
  GError *error = NULL;
  GDBusConnection *bus;
  DragBrokerBroker1Manager *manager;
  DragBrokerBroker1Session *session;
  gchar *path = NULL, *operation = NULL, *kind = NULL, *remote = NULL;
  GVariant *items, *handle = NULL, *types;
  GVariantIter iter;
  const gchar *name;
  gdouble width, height;
  GUnixFDList *fds = NULL;
  GByteArray *bytes;
  int fd, status;

  if (argc != 4)
    {
      fprintf (stderr, "usage: %s TOKEN TYPE OUTPUT\n", argv[0]);
      return 2;
    }
  token = argv[1];
  type = argv[2];
  output = argv[3];
  setvbuf (stdout, NULL, _IOLBF, 0);
  /* Before any call: GDBus maps an error reply through the domains registered by then. */
  dragbroker_error_quark ();

  bus = g_bus_get_sync (G_BUS_TYPE_SESSION, NULL, &error);
  if (bus == NULL)
    return fail ("connecting to the session bus", error);
  manager = drag_broker_broker1_manager_proxy_new_sync (bus, G_DBUS_PROXY_FLAGS_DO_NOT_LOAD_PROPERTIES, BROKER_NAME,
                                                        MANAGER_PATH, NULL, &error);
  if (manager == NULL)
    return fail ("reaching the broker", error);
  if (!drag_broker_broker1_manager_call_present_token_sync (manager, token, &path, NULL, &error))
    return fail ("PresentToken", error);
  printf ("destination: joined %s\n", path);

  /* The proxy subscribes to the session's signals now, before any load can finish. */
  session = drag_broker_broker1_session_proxy_new_sync (bus, G_DBUS_PROXY_FLAGS_DO_NOT_LOAD_PROPERTIES, BROKER_NAME,
                                                        path, NULL, &error);
  if (session == NULL)
    return fail ("reaching the session", error);
  finish.loop = g_main_loop_new (NULL, FALSE);
  g_signal_connect (session, "load-finished", G_CALLBACK (on_load_finished), &finish);

  /* Only the types this app may see, never data. */
  if (!drag_broker_broker1_session_call_get_items_sync (session, &items, NULL, &error))
    return fail ("GetItems", error);
  g_variant_iter_init (&iter, items);
  while (g_variant_iter_next (&iter, "(&sdd@as)", &name, &width, &height, &types))
    {
      const gchar **strv = g_variant_get_strv (types, NULL);
      gchar *list = g_strjoinv (" ", (gchar **) strv);
      printf ("destination: item %s %gx%g types %s\n", name, width, height, list);
      g_free (list);
      g_free (strv);
      g_variant_unref (types);
    }
  g_variant_unref (items);

  /* A refusal, as an app meets one: no data moves before the drop. */
  if (drag_broker_broker1_session_call_load_sync (session, 0, type, NULL, &handle, &finish.load, &kind, &fds, NULL,
                                                  &error))
    {
      fprintf (stderr, "destination: a load before the drop was not refused\n");
      return 1;
    }
  remote = g_dbus_error_get_remote_error (error);
  g_dbus_error_strip_remote_error (error);
  if (g_error_matches (error, DRAGBROKER_ERROR, DRAGBROKER_ERROR_WRONG_STATE))
    printf ("destination: load before the drop: DRAGBROKER_ERROR_WRONG_STATE (%s): %s\n", remote, error->message);
  else
    printf ("destination: load before the drop: %s %d (%s): %s\n", g_quark_to_string (error->domain), error->code,
            remote, error->message);
  g_clear_error (&error);
  g_free (remote);

  if (!drag_broker_broker1_session_call_enter_sync (session, "copy", &operation, NULL, &error))
    return fail ("Enter", error);
  printf ("destination: enter copy -> %s\n", operation);
  g_free (operation);
  if (!drag_broker_broker1_session_call_perform_drop_sync (session, &operation, NULL, &error))
    return fail ("PerformDrop", error);
  printf ("destination: drop -> %s\n", operation);
  g_free (operation);

  if (!drag_broker_broker1_session_call_load_sync (session, 0, type, NULL, &handle, &finish.load, &kind, &fds, NULL,
                                                  &error))
    return fail ("Load", error);
  /* The reply's h is an index into its descriptor list. get() duplicates; dropping the
   * list closes the originals. */
  fd = g_unix_fd_list_get (fds, g_variant_get_handle (handle), &error);
  g_object_unref (fds);
  g_variant_unref (handle);
  if (fd < 0)
    return fail ("taking the descriptor", error);
  bytes = read_all (fd, &error);
  close (fd);
  if (bytes == NULL)
    return fail ("reading the load", error);
  printf ("destination: %s load %u read %u bytes\n", kind, finish.load, bytes->len);
  if (!g_file_set_contents (output, (const gchar *) bytes->data, bytes->len, &error))
    return fail ("writing the output", error);

  /* End of file alone does not say the data is complete; LoadFinished does. */
  finish.timeout = g_timeout_add_seconds (20, on_timeout, &finish);
  if (!finish.finished)
    g_main_loop_run (finish.loop);
  if (finish.timeout != 0)
    g_source_remove (finish.timeout);
  if (!finish.finished)
    {
      fprintf (stderr, "destination: no LoadFinished for load %u within 20 s\n", finish.load);
      return 1;
    }
  if (*finish.error == '\0')
    printf ("destination: LoadFinished %u %" G_GUINT64_FORMAT "\n", finish.load, finish.bytes);
  else
    printf ("destination: LoadFinished %u %" G_GUINT64_FORMAT " %s %s\n", finish.load, finish.bytes, finish.error,
            finish.message);

  if (!drag_broker_broker1_session_call_conclude_sync (session, NULL, &error))
    return fail ("Conclude", error);
  printf ("destination: concluded\n");
  status = *finish.error == '\0' ? 0 : 1;

  g_byte_array_unref (bytes);
  g_free (kind);
  g_free (finish.error);
  g_free (finish.message);
  g_main_loop_unref (finish.loop);
  g_object_unref (session);
  g_object_unref (manager);
  g_object_unref (bus);
  g_free (path);
  return status;
}
