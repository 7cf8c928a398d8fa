/* A GTK 4 drop target for dragbroker drags, written from docs/desktop-drag-protocol.md and the
 * interface XML alone, on the binding gdbus-codegen generates from that XML.
 *
 *   gtk4-target [--title TITLE] --accept TYPE [--accept TYPE ...]
 *
 * TYPE is a MIME type (image/png), a wildcard over a top-level type, or a UTI (public.image).
 * The broker is on $DRAGBROKER_BUS_ADDRESS when set, else on the session bus. Every line on
 * stdout is flushed:
 *
 *   READY                                  the window is mapped
 *   STATUS copy|move|forbidden|cancel      a drop status taken from the broker's answer
 *   DROPPED copy|move                      PerformDrop's answer
 *   LOADED ITEM TYPE NBYTES SHA256         one item, every byte accounted for
 *   LOAD-FAILED ITEM TYPE ERROR MESSAGE    a load that did not deliver every byte
 *   CONCLUDED
 *   REFUSED ERROR MESSAGE                  the broker refused a call; ERROR is its D-Bus name
 *
 * Nothing here blocks the main loop once the window is up: the token, the broker's calls and
 * the bytes all arrive through callbacks, so the pointer never freezes over the window. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <gio/gunixfdlist.h>
#include <gio/gunixinputstream.h>
#include <gtk/gtk.h>

#include "dragbroker-errors.h"
#include "dragbroker-generated.h"

#define BROKER_NAME "org.dragbroker.Broker1"
#define MANAGER_PATH "/org/dragbroker/Broker1"
#define TOKEN_TYPE "application/vnd.dragbroker.token.v1"
#define TOKEN_LENGTH 64
/* GTK 3 sources send a leave right before the drop; an Exit sent at once would withdraw the
 * proposal PerformDrop needs. */
#define EXIT_DELAY_MS 200
/* End of file alone does not prove a data load complete; LoadFinished does. Give up on it
 * after this long rather than hold the source's drag forever. */
#define LOAD_FINISHED_TIMEOUT_S 30

typedef struct _Session Session;
typedef struct _Visit Visit;
typedef struct _Load Load;

/* One item the app takes, and the type it loads it as. */
typedef struct {
  guint item;
  gchar *type;
} Choice;

/* The broker session behind one drag. It outlives a single pass over the window: after a leave
 * and a return the app is still a party and only calls Enter again. */
struct _Session {
  gint refs;
  gchar *token;
  gchar *path;
  DragBrokerBroker1Session *proxy;
  GVariant **conforming; /* ConformingItems' answer per --accept pattern */
  guint step;
  GArray *choices;
  gboolean decided;
  gboolean failed;
  gboolean ended;
  gboolean entered; /* a proposal of ours stands: Exit is owed */
  guint exit_timer;
  GPtrArray *waiting; /* visits that arrived while the decision was being made */
  Load *load;         /* the load in flight, to match LoadFinished against */
  GHashTable *early;  /* LoadFinished that overtook its Load reply, by load ID */
};

/* One GdkDrop over the drop area: from drag-enter to its leave, or to gdk_drop_finish. */
struct _Visit {
  gint refs;
  GdkDrop *drop;
  GCancellable *cancellable;
  Session *session;
  GdkDragAction answer; /* what motion reports until the broker says otherwise */
  gchar *proposal;
  gboolean proposing;
  gboolean left;
  gboolean drop_requested;
  gboolean dropping;
  gboolean finished;
  gboolean failed;
  GdkDragAction operation;
  guint next_choice;
};

typedef struct {
  guint64 bytes;
  gchar *error;
  gchar *message;
} Finished;

struct _Load {
  Visit *visit;
  guint item;
  gchar *type;
  guint id;
  gboolean file;
  gboolean awaits_finished; /* a pipe: only LoadFinished says whether it carried everything */
  GBytes *data;
  gchar *sha256;
  gboolean read_done;
  gboolean refused;
  gchar *read_error;
  Finished *finished;
  guint timeout;
};

typedef struct {
  gchar **accept;
  GDBusConnection *bus;
  DragBrokerBroker1Manager *manager;
  GtkWidget *window;
  GtkWidget *area;
  GtkWidget *label;
  GtkWidget *picture;
  Session *session;
  Visit *visit;
  gboolean ready;
  GMainLoop *loop;
} App;

static App app;

static void say (const gchar *format, ...) G_GNUC_PRINTF (1, 2);

static void
say (const gchar *format, ...)
{
  va_list args;

  va_start (args, format);
  vprintf (format, args);
  va_end (args);
  putchar ('\n');
  fflush (stdout);
}

static void
show (const gchar *text)
{
  gtk_label_set_text (GTK_LABEL (app.label), text);
}

/* Reports a failed call. A broker refusal is printed under its D-Bus name, through the error
 * domain when the name is one the interfaces list; anything else (a lost bus, a cancelled
 * call) is a local failure and goes to stderr. Returns whether it was a refusal. */
static gboolean
report (const gchar *what, GError *error)
{
  gchar *name = NULL;

  if (g_error_matches (error, G_IO_ERROR, G_IO_ERROR_CANCELLED))
    return FALSE;
  if (error->domain == DRAGBROKER_ERROR)
    {
      g_dbus_error_strip_remote_error (error);
      name = g_dbus_error_encode_gerror (error);
    }
  else if (g_dbus_error_is_remote_error (error))
    {
      name = g_dbus_error_get_remote_error (error);
      g_dbus_error_strip_remote_error (error);
    }
  if (name == NULL)
    {
      fprintf (stderr, "gtk4-target: %s: %s\n", what, error->message);
      return FALSE;
    }
  fprintf (stderr, "gtk4-target: %s refused\n", what);
  say ("REFUSED %s %s", name, error->message);
  g_free (name);
  return TRUE;
}

/* ---- Types ---- */

/* The media type without parameters, in lower case: "text/plain;charset=utf-8" is text/plain. */
static gchar *
base_type (const gchar *type)
{
  const gchar *end = strchr (type, ';');
  gchar *bare = g_strndup (type, end != NULL ? (gsize) (end - type) : strlen (type));
  gchar *lower = g_ascii_strdown (g_strstrip (bare), -1);

  g_free (bare);
  return lower;
}

static gboolean
type_matches (const gchar *pattern, const gchar *type)
{
  gchar *p = base_type (pattern), *t = base_type (type);
  gboolean match;

  if (strcmp (p, "*") == 0 || strcmp (p, "*/*") == 0)
    match = TRUE;
  else if (g_str_has_suffix (p, "/*"))
    match = strncmp (p, t, strlen (p) - 1) == 0;
  else
    match = strcmp (p, t) == 0;
  g_free (p);
  g_free (t);
  return match;
}

static gboolean
contains (GVariant *indices, guint item)
{
  gsize count, i;
  const guint32 *values = g_variant_get_fixed_array (indices, &count, sizeof (guint32));

  for (i = 0; i < count; i++)
    if (values[i] == item)
      return TRUE;
  return FALSE;
}

/* The broker decides what conforms (text/plain covers text/x-python, public.image covers
 * image/png); the app only picks, among the types the item shows it, the one it wants. In
 * --accept order, then the item's own order, best first. Load wants one of those exact types,
 * and ConformingItems names items, not types: where conformance is something only the broker
 * knows (a subtype, a UTI), the item's best type is the guess. */
static gchar *
choose_type (Session *session, guint item, const gchar *const *types)
{
  guint p, t;

  for (p = 0; app.accept[p] != NULL; p++)
    {
      if (!contains (session->conforming[p], item))
        continue;
      for (t = 0; types[t] != NULL; t++)
        if (type_matches (app.accept[p], types[t]))
          return g_strdup (types[t]);
    }
  for (p = 0; app.accept[p] != NULL; p++)
    if (contains (session->conforming[p], item))
      return g_strdup (types[0]);
  return NULL;
}

static gboolean
valid_token (GBytes *bytes)
{
  gsize size, i;
  const gchar *text = g_bytes_get_data (bytes, &size);

  if (size != TOKEN_LENGTH)
    return FALSE;
  for (i = 0; i < size; i++)
    if (!g_ascii_isdigit (text[i]) && !(text[i] >= 'a' && text[i] <= 'f'))
      return FALSE;
  return TRUE;
}

static GdkDragAction
action_for (const gchar *operation)
{
  if (g_strcmp0 (operation, "copy") == 0)
    return GDK_ACTION_COPY;
  if (g_strcmp0 (operation, "move") == 0)
    return GDK_ACTION_MOVE;
  return 0;
}

/* On X11 the drop's actions are the one action the source suggests, which turns to move when
 * the user holds Shift: that is the user asking for a move. */
static const gchar *
wanted_proposal (Visit *visit)
{
  GdkDragAction actions = gdk_drop_get_actions (visit->drop);

  if (visit->session != NULL && visit->session->choices->len == 0)
    return "cancel";
  return (actions & GDK_ACTION_MOVE) && !(actions & GDK_ACTION_COPY) ? "move" : "copy";
}

/* ---- Reading to end of file, off the main loop's back ---- */

typedef struct {
  GBytes *data;
  gchar *sha256;
} Received;

static void
received_free (gpointer pointer)
{
  Received *received = pointer;

  g_bytes_unref (received->data);
  g_free (received->sha256);
  g_free (received);
}

static Received *
received_new (GByteArray *bytes)
{
  Received *received = g_new0 (Received, 1);

  received->sha256 = g_compute_checksum_for_data (G_CHECKSUM_SHA256, bytes->data, bytes->len);
  received->data = g_byte_array_free_to_bytes (bytes);
  return received;
}

typedef struct {
  GInputStream *stream;
  GByteArray *bytes;
  gsize limit;
} Reading;

static void
reading_free (gpointer pointer)
{
  Reading *reading = pointer;

  g_object_unref (reading->stream);
  if (reading->bytes != NULL)
    g_byte_array_unref (reading->bytes);
  g_free (reading);
}

static void read_chunk (GTask *task);

static void
on_chunk (GObject *object, GAsyncResult *result, gpointer user_data)
{
  GTask *task = user_data;
  Reading *reading = g_task_get_task_data (task);
  GError *error = NULL;
  GBytes *chunk = g_input_stream_read_bytes_finish (G_INPUT_STREAM (object), result, &error);
  gsize size;
  const guint8 *data;

  if (chunk == NULL)
    {
      g_task_return_error (task, error);
      g_object_unref (task);
      return;
    }
  data = g_bytes_get_data (chunk, &size);
  if (size == 0)
    {
      Received *received = received_new (g_steal_pointer (&reading->bytes));
      g_task_return_pointer (task, received, received_free);
      g_object_unref (task);
    }
  else if (reading->bytes->len + size > reading->limit)
    {
      g_task_return_new_error (task, G_IO_ERROR, G_IO_ERROR_MESSAGE_TOO_LARGE, "more than %" G_GSIZE_FORMAT " bytes",
                               reading->limit);
      g_object_unref (task);
    }
  else
    {
      g_byte_array_append (reading->bytes, data, (guint) size);
      read_chunk (task);
    }
  g_bytes_unref (chunk);
}

static void
read_chunk (GTask *task)
{
  Reading *reading = g_task_get_task_data (task);

  g_input_stream_read_bytes_async (reading->stream, 65536, G_PRIORITY_DEFAULT, g_task_get_cancellable (task),
                                   on_chunk, task);
}

/* Reads a stream (the drop's token, a load's pipe) to end of file with asynchronous reads. */
static void
read_stream (GInputStream *stream, gsize limit, GCancellable *cancellable, GAsyncReadyCallback callback,
             gpointer user_data)
{
  GTask *task = g_task_new (NULL, cancellable, callback, user_data);
  Reading *reading = g_new0 (Reading, 1);

  reading->stream = g_object_ref (stream);
  reading->bytes = g_byte_array_new ();
  reading->limit = limit;
  g_task_set_task_data (task, reading, reading_free);
  read_chunk (task);
}

static void
close_descriptor (gpointer pointer)
{
  close (GPOINTER_TO_INT (pointer));
}

/* A file load hands over the source's own file or sealed memfd, whose offset may be shared with
 * the source: pread from 0 leaves that offset alone. It may be large, so a worker thread reads. */
static void
read_file_thread (GTask *task, gpointer source, gpointer task_data, GCancellable *cancellable)
{
  int fd = GPOINTER_TO_INT (task_data);
  GByteArray *bytes = g_byte_array_new ();
  guint8 chunk[65536];
  off_t offset = 0;

  (void) source;
  (void) cancellable;
  for (;;)
    {
      ssize_t count;

      if (g_task_return_error_if_cancelled (task))
        {
          g_byte_array_unref (bytes);
          return;
        }
      count = pread (fd, chunk, sizeof chunk, offset);
      if (count == 0)
        break;
      if (count < 0)
        {
          int saved = errno;
          if (saved == EINTR)
            continue;
          g_task_return_new_error (task, G_IO_ERROR, g_io_error_from_errno (saved), "pread: %s", g_strerror (saved));
          g_byte_array_unref (bytes);
          return;
        }
      g_byte_array_append (bytes, chunk, (guint) count);
      offset += count;
    }
  g_task_return_pointer (task, received_new (bytes), received_free);
}

static void
read_file (int fd, GCancellable *cancellable, GAsyncReadyCallback callback, gpointer user_data)
{
  GTask *task = g_task_new (NULL, cancellable, callback, user_data);

  g_task_set_task_data (task, GINT_TO_POINTER (fd), close_descriptor);
  g_task_run_in_thread (task, read_file_thread);
  g_object_unref (task);
}

/* ---- Sessions and visits ---- */

static void
choice_clear (gpointer pointer)
{
  g_free (((Choice *) pointer)->type);
}

static void
finished_free (gpointer pointer)
{
  Finished *finished = pointer;

  g_free (finished->error);
  g_free (finished->message);
  g_free (finished);
}

static Session *
session_new (const gchar *token)
{
  Session *session = g_new0 (Session, 1);

  session->refs = 1;
  session->token = g_strdup (token);
  session->conforming = g_new0 (GVariant *, g_strv_length (app.accept));
  session->choices = g_array_new (FALSE, TRUE, sizeof (Choice));
  g_array_set_clear_func (session->choices, choice_clear);
  session->waiting = g_ptr_array_new ();
  session->early = g_hash_table_new_full (NULL, NULL, NULL, finished_free);
  return session;
}

static Session *
session_ref (Session *session)
{
  session->refs++;
  return session;
}

static void
session_unref (Session *session)
{
  guint i;

  if (--session->refs > 0)
    return;
  g_clear_handle_id (&session->exit_timer, g_source_remove);
  if (session->proxy != NULL)
    {
      g_signal_handlers_disconnect_by_data (session->proxy, session);
      g_object_unref (session->proxy);
    }
  for (i = 0; app.accept[i] != NULL; i++)
    if (session->conforming[i] != NULL)
      g_variant_unref (session->conforming[i]);
  g_free (session->conforming);
  g_array_unref (session->choices);
  g_ptr_array_unref (session->waiting);
  g_hash_table_unref (session->early);
  g_free (session->token);
  g_free (session->path);
  g_free (session);
}

static Visit *
visit_ref (Visit *visit)
{
  visit->refs++;
  return visit;
}

static void
visit_unref (Visit *visit)
{
  if (--visit->refs > 0)
    return;
  g_object_unref (visit->drop);
  g_object_unref (visit->cancellable);
  if (visit->session != NULL)
    session_unref (visit->session);
  g_free (visit->proposal);
  g_free (visit);
}

static void
on_exit_reply (GObject *object, GAsyncResult *result, gpointer user_data)
{
  GError *error = NULL;

  (void) user_data;
  if (!drag_broker_broker1_session_call_exit_finish (DRAG_BROKER_BROKER1_SESSION (object), result, &error))
    {
      report ("Exit", error);
      g_error_free (error);
    }
}

static void
session_exit_now (Session *session)
{
  g_clear_handle_id (&session->exit_timer, g_source_remove);
  if (!session->entered || session->ended)
    return;
  session->entered = FALSE;
  drag_broker_broker1_session_call_exit (session->proxy, NULL, on_exit_reply, NULL);
}

static gboolean
on_exit_due (gpointer user_data)
{
  Session *session = user_data;

  session->exit_timer = 0;
  session_exit_now (session);
  return G_SOURCE_REMOVE;
}

static void
session_defer_exit (Session *session)
{
  g_clear_handle_id (&session->exit_timer, g_source_remove);
  if (session->entered && !session->ended)
    session->exit_timer = g_timeout_add (EXIT_DELAY_MS, on_exit_due, session);
}

/* The app stops being this drag's party: a new drag came, or this one is over. A deferred
 * Exit still owed goes out now rather than never. */
static void
session_forget (Session *session)
{
  if (app.session != session)
    return;
  session_exit_now (session);
  app.session = NULL;
  session_unref (session);
}

static void
visit_finish (Visit *visit, GdkDragAction action)
{
  if (visit->finished)
    return;
  visit->finished = TRUE;
  gdk_drop_finish (visit->drop, action);
  /* GTK 4.8 on X11 sends no leave after a drop until the next drag arrives, so the drop
   * highlight would linger until then. */
  gtk_widget_unset_state_flags (app.area, GTK_STATE_FLAG_DROP_ACTIVE);
}

/* The drag cannot be taken here: show it refused, and fail a drop already made. */
static void
visit_fail (Visit *visit)
{
  visit->failed = TRUE;
  visit->answer = 0;
  if (visit->drop_requested)
    visit_finish (visit, 0);
  else if (!visit->left)
    gdk_drop_status (visit->drop, 0, 0);
}

static void perform_drop (Visit *visit);

static void
proposal_answered (Visit *visit, const gchar *what, gchar *operation, GError *error)
{
  Session *session = visit->session;

  visit->proposing = FALSE;
  if (operation == NULL)
    {
      report (what, error);
      g_error_free (error);
      visit_fail (visit);
      visit_unref (visit);
      return;
    }
  session->entered = TRUE;
  visit->answer = action_for (operation);
  if (visit->drop_requested)
    perform_drop (visit);
  else if (visit->left)
    {
      /* A later pass over the window that has entered again keeps the proposal alive. */
      if (app.visit == NULL || app.visit->session != session)
        session_defer_exit (session);
    }
  else
    {
      /* The same actions the drop target gives GTK on every motion, so the two agree. On X11
       * a drop offers only the action the source suggests, move while Shift is held: a copy
       * answered to a move proposal can then only be shown as a move, never refused. */
      if (visit->answer != 0)
        gdk_drop_status (visit->drop, GDK_ACTION_COPY | GDK_ACTION_MOVE, visit->answer);
      else
        gdk_drop_status (visit->drop, 0, 0);
      say ("STATUS %s", operation);
      show (visit->answer != 0 ? "Release to drop" : "The broker refuses this drop here");
    }
  g_free (operation);
  visit_unref (visit);
}

static void
on_entered (GObject *object, GAsyncResult *result, gpointer user_data)
{
  GError *error = NULL;
  gchar *operation = NULL;

  drag_broker_broker1_session_call_enter_finish (DRAG_BROKER_BROKER1_SESSION (object), &operation, result, &error);
  proposal_answered (user_data, "Enter", operation, error);
}

static void
on_updated (GObject *object, GAsyncResult *result, gpointer user_data)
{
  GError *error = NULL;
  gchar *operation = NULL;

  drag_broker_broker1_session_call_update_finish (DRAG_BROKER_BROKER1_SESSION (object), &operation, result, &error);
  proposal_answered (user_data, "Update", operation, error);
}

/* The decision is made: propose. A visit that already left proposes nothing, so owes no Exit;
 * a return after a leave whose Exit is still deferred sends that Exit first, then enters
 * again. */
static void
visit_propose (Visit *visit)
{
  Session *session = visit->session;

  if (session->failed || session->ended)
    {
      visit_fail (visit);
      return;
    }
  if (visit->left && !visit->drop_requested)
    return;
  if (session->exit_timer != 0)
    session_exit_now (session);
  g_free (visit->proposal);
  visit->proposal = g_strdup (wanted_proposal (visit));
  visit->proposing = TRUE;
  drag_broker_broker1_session_call_enter (session->proxy, visit->proposal, NULL, on_entered, visit_ref (visit));
}

static void
session_decided (Session *session, gboolean failed)
{
  GPtrArray *waiting = session->waiting;
  guint i;

  session->decided = TRUE;
  session->failed = failed;
  session->waiting = g_ptr_array_new ();
  for (i = 0; i < waiting->len; i++)
    {
      visit_propose (waiting->pdata[i]);
      visit_unref (waiting->pdata[i]);
    }
  g_ptr_array_unref (waiting);
  if (failed)
    session_forget (session);
}

static void
on_items (GObject *object, GAsyncResult *result, gpointer user_data)
{
  Session *session = user_data;
  GError *error = NULL;
  GVariant *items = NULL;
  GVariantIter iter;
  const gchar *name;
  const gchar **types;
  gdouble width, height;
  guint item = 0;

  if (!drag_broker_broker1_session_call_get_items_finish (DRAG_BROKER_BROKER1_SESSION (object), &items, result,
                                                          &error))
    {
      report ("GetItems", error);
      g_error_free (error);
      session_decided (session, TRUE);
      session_unref (session);
      return;
    }
  g_variant_iter_init (&iter, items);
  while (g_variant_iter_next (&iter, "(&sdd^a&s)", &name, &width, &height, &types))
    {
      if (types[0] != NULL)
        {
          Choice choice = { item, choose_type (session, item, types) };
          if (choice.type != NULL)
            {
              fprintf (stderr, "gtk4-target: item %u %s: taking %s\n", item, name, choice.type);
              g_array_append_val (session->choices, choice);
            }
        }
      g_free (types);
      item++;
    }
  g_variant_unref (items);
  session_decided (session, FALSE);
  session_unref (session);
}

static void ask_conforming (Session *session);

static void
on_conforming (GObject *object, GAsyncResult *result, gpointer user_data)
{
  Session *session = user_data;
  GError *error = NULL;

  if (!drag_broker_broker1_session_call_conforming_items_finish (DRAG_BROKER_BROKER1_SESSION (object),
                                                                 &session->conforming[session->step], result, &error))
    {
      report ("ConformingItems", error);
      g_error_free (error);
      session_decided (session, TRUE);
      session_unref (session);
      return;
    }
  session->step++;
  ask_conforming (session);
}

/* Which items the app can take: one ConformingItems per accepted type, then GetItems to pick
 * each item's type. Never data: nothing moves before the drop. */
static void
ask_conforming (Session *session)
{
  if (app.accept[session->step] != NULL)
    drag_broker_broker1_session_call_conforming_items (session->proxy, app.accept[session->step], NULL,
                                                       on_conforming, session);
  else
    drag_broker_broker1_session_call_get_items (session->proxy, NULL, on_items, session);
}

static void load_complete (Load *load);

static void
on_load_finished (DragBrokerBroker1Session *proxy, guint load, guint64 bytes, const gchar *error_name,
                  const gchar *message, gpointer user_data)
{
  Session *session = user_data;
  Finished *finished = g_new0 (Finished, 1);

  (void) proxy;
  finished->bytes = bytes;
  finished->error = g_strdup (error_name);
  finished->message = g_strdup (message);
  if (session->load != NULL && session->load->id == load && session->load->finished == NULL)
    {
      session->load->finished = finished;
      load_complete (session->load);
    }
  else
    g_hash_table_replace (session->early, GUINT_TO_POINTER (load), finished);
}

static void
on_ended (DragBrokerBroker1Session *proxy, const gchar *operation, const gchar *error_name, const gchar *message,
          gpointer user_data)
{
  Session *session = user_data;

  (void) proxy;
  fprintf (stderr, "gtk4-target: the session ended: %s%s%s%s%s\n", operation, *error_name ? " " : "", error_name,
           *message ? " " : "", message);
  session->ended = TRUE;
  session->entered = FALSE;
  g_clear_handle_id (&session->exit_timer, g_source_remove);
  /* On X11 another client may have dropped first; the pointer still over us must stop
   * promising a drop. */
  if (app.visit != NULL && app.visit->session == session && !app.visit->drop_requested)
    {
      app.visit->answer = 0;
      gdk_drop_status (app.visit->drop, 0, 0);
      show ("The drag ended elsewhere");
    }
  /* A drop in progress still has its loads to finish; the next drag starts afresh. */
  session_forget (session);
}

static void
on_session_proxy (GObject *object, GAsyncResult *result, gpointer user_data)
{
  Session *session = user_data;
  GError *error = NULL;

  (void) object;
  session->proxy = drag_broker_broker1_session_proxy_new_finish (result, &error);
  if (session->proxy == NULL)
    {
      report ("reaching the session", error);
      g_error_free (error);
      session_decided (session, TRUE);
      session_unref (session);
      return;
    }
  g_signal_connect (session->proxy, "load-finished", G_CALLBACK (on_load_finished), session);
  g_signal_connect (session->proxy, "ended", G_CALLBACK (on_ended), session);
  ask_conforming (session);
}

static void
on_presented (GObject *object, GAsyncResult *result, gpointer user_data)
{
  Session *session = user_data;
  GError *error = NULL;

  if (!drag_broker_broker1_manager_call_present_token_finish (DRAG_BROKER_BROKER1_MANAGER (object), &session->path,
                                                              result, &error))
    {
      report ("PresentToken", error);
      g_error_free (error);
      session_decided (session, TRUE);
      session_unref (session);
      return;
    }
  /* The proxy subscribes to the session's signals before any call that could make one fire.
   * The broker has just answered, so asking the bus to start it would only cost a round trip. */
  drag_broker_broker1_session_proxy_new (app.bus,
                                         G_DBUS_PROXY_FLAGS_DO_NOT_LOAD_PROPERTIES
                                             | G_DBUS_PROXY_FLAGS_DO_NOT_AUTO_START,
                                         BROKER_NAME, session->path, NULL, on_session_proxy, session);
}

static void
visit_attach (Visit *visit, Session *session)
{
  visit->session = session_ref (session);
  if (session->decided)
    visit_propose (visit);
  else
    g_ptr_array_add (session->waiting, visit_ref (visit));
}

static void
on_token_read (GObject *object, GAsyncResult *result, gpointer user_data)
{
  Visit *visit = user_data;
  GError *error = NULL;
  Received *received = g_task_propagate_pointer (G_TASK (result), &error);
  gchar *token;

  (void) object;
  if (received == NULL)
    {
      if (!g_error_matches (error, G_IO_ERROR, G_IO_ERROR_CANCELLED))
        {
          fprintf (stderr, "gtk4-target: reading the token: %s\n", error->message);
          visit_fail (visit);
        }
      g_error_free (error);
      visit_unref (visit);
      return;
    }
  if (!valid_token (received->data))
    {
      fprintf (stderr, "gtk4-target: the drag's token is not 64 lowercase hexadecimal characters\n");
      received_free (received);
      visit_fail (visit);
      visit_unref (visit);
      return;
    }
  token = g_strndup (g_bytes_get_data (received->data, NULL), TOKEN_LENGTH);
  received_free (received);

  if (app.session != NULL && !app.session->ended && strcmp (app.session->token, token) == 0)
    visit_attach (visit, app.session);
  else
    {
      if (app.session != NULL)
        session_forget (app.session);
      app.session = session_new (token);
      visit_attach (visit, app.session);
      drag_broker_broker1_manager_call_present_token (app.manager, token, NULL, on_presented,
                                                      session_ref (app.session));
    }
  g_free (token);
  visit_unref (visit);
}

static void
on_token_stream (GObject *object, GAsyncResult *result, gpointer user_data)
{
  Visit *visit = user_data;
  GError *error = NULL;
  GInputStream *stream = gdk_drop_read_finish (GDK_DROP (object), result, NULL, &error);

  if (stream == NULL)
    {
      if (!g_error_matches (error, G_IO_ERROR, G_IO_ERROR_CANCELLED))
        {
          fprintf (stderr, "gtk4-target: reading the token: %s\n", error->message);
          visit_fail (visit);
        }
      g_error_free (error);
      visit_unref (visit);
      return;
    }
  /* One byte over the token's length is enough to refuse a payload that is too long. */
  read_stream (stream, TOKEN_LENGTH + 1, visit->cancellable, on_token_read, visit);
  g_object_unref (stream);
}

/* ---- The drop ---- */

static void
on_concluded (GObject *object, GAsyncResult *result, gpointer user_data)
{
  Visit *visit = user_data;
  GError *error = NULL;

  if (drag_broker_broker1_session_call_conclude_finish (DRAG_BROKER_BROKER1_SESSION (object), result, &error))
    {
      say ("CONCLUDED");
      visit_finish (visit, visit->operation);
    }
  else
    {
      report ("Conclude", error);
      g_error_free (error);
      visit_finish (visit, 0);
    }
  session_forget (visit->session);
  visit_unref (visit);
}

static void load_next (Visit *visit);

static void
load_free (Load *load)
{
  if (load->visit->session->load == load)
    load->visit->session->load = NULL;
  g_clear_handle_id (&load->timeout, g_source_remove);
  visit_unref (load->visit);
  g_free (load->type);
  if (load->data != NULL)
    g_bytes_unref (load->data);
  g_free (load->sha256);
  g_free (load->read_error);
  if (load->finished != NULL)
    finished_free (load->finished);
  g_free (load);
}

static void
display (Load *load)
{
  GdkTexture *texture;
  gchar *text;

  if (g_str_has_prefix (load->type, "image/") && (texture = gdk_texture_new_from_bytes (load->data, NULL)) != NULL)
    {
      gtk_picture_set_paintable (GTK_PICTURE (app.picture), GDK_PAINTABLE (texture));
      g_object_unref (texture);
    }
  text = g_strdup_printf ("Received item %u as %s: %" G_GSIZE_FORMAT " bytes", load->item, load->type,
                          g_bytes_get_size (load->data));
  show (text);
  g_free (text);
}

/* A load is done when its bytes are read and, for a pipe, LoadFinished said whether they are
 * all there: the pipe's end of file alone cannot tell a finished source from a failed one. */
static void
load_complete (Load *load)
{
  Visit *visit = load->visit;
  gsize size = load->data != NULL ? g_bytes_get_size (load->data) : 0;

  if (!load->read_done || (load->awaits_finished && load->finished == NULL))
    return;
  if (load->refused)
    {
      /* REFUSED has already said why. */
    }
  else if (load->read_error != NULL)
    say ("LOAD-FAILED %u %s read %s", load->item, load->type, load->read_error);
  else if (load->finished != NULL && *load->finished->error != '\0')
    say ("LOAD-FAILED %u %s %s %s", load->item, load->type, load->finished->error, load->finished->message);
  else if (load->finished != NULL && load->finished->bytes != size)
    say ("LOAD-FAILED %u %s read %" G_GSIZE_FORMAT " bytes, the broker delivered %" G_GUINT64_FORMAT, load->item,
         load->type, size, load->finished->bytes);
  else
    {
      say ("LOADED %u %s %" G_GSIZE_FORMAT " %s", load->item, load->type, size, load->sha256);
      display (load);
    }
  visit_ref (visit);
  load_free (load);
  load_next (visit);
  visit_unref (visit);
}

static gboolean
on_load_timeout (gpointer user_data)
{
  Load *load = user_data;

  load->timeout = 0;
  load->finished = g_new0 (Finished, 1);
  load->finished->error = g_strdup ("timeout");
  load->finished->message = g_strdup_printf ("no LoadFinished within %d s", LOAD_FINISHED_TIMEOUT_S);
  load_complete (load);
  return G_SOURCE_REMOVE;
}

static void
on_load_read (GObject *object, GAsyncResult *result, gpointer user_data)
{
  Load *load = user_data;
  GError *error = NULL;
  Received *received = g_task_propagate_pointer (G_TASK (result), &error);

  (void) object;
  load->read_done = TRUE;
  if (received == NULL)
    {
      load->read_error = g_strdup (error->message);
      g_error_free (error);
      /* The bytes are lost either way; LoadFinished would only say why. */
      load->awaits_finished = FALSE;
    }
  else
    {
      load->data = g_bytes_ref (received->data);
      load->sha256 = g_strdup (received->sha256);
      received_free (received);
    }
  if (load->awaits_finished && load->finished == NULL)
    load->timeout = g_timeout_add_seconds (LOAD_FINISHED_TIMEOUT_S, on_load_timeout, load);
  load_complete (load);
}

static void
on_load_reply (GObject *object, GAsyncResult *result, gpointer user_data)
{
  Load *load = user_data;
  Session *session = load->visit->session;
  GError *error = NULL;
  GVariant *handle = NULL;
  GUnixFDList *fds = NULL;
  gchar *kind = NULL;
  int fd = -1;

  if (!drag_broker_broker1_session_call_load_finish (DRAG_BROKER_BROKER1_SESSION (object), &handle, &load->id, &kind,
                                                     &fds, result, &error))
    {
      report ("Load", error);
      g_error_free (error);
      load->read_done = TRUE;
      load->refused = TRUE;
      load_complete (load);
      return;
    }
  /* The reply's h indexes its descriptor list; get() duplicates, and the list closes its own. */
  if (fds != NULL)
    fd = g_unix_fd_list_get (fds, g_variant_get_handle (handle), &error);
  else
    error = g_error_new (G_IO_ERROR, G_IO_ERROR_FAILED, "the reply carries no descriptor");
  g_clear_object (&fds);
  g_variant_unref (handle);
  load->file = g_strcmp0 (kind, "file") == 0;
  /* A file load's descriptor is the whole file already; a pipe's end of file is not proof. */
  load->awaits_finished = !load->file;
  g_free (kind);
  if (fd < 0)
    {
      load->read_done = TRUE;
      load->awaits_finished = FALSE;
      load->read_error = g_strdup (error->message);
      g_error_free (error);
      load_complete (load);
      return;
    }
  session->load = load;
  load->finished = g_hash_table_lookup (session->early, GUINT_TO_POINTER (load->id));
  if (load->finished != NULL)
    g_hash_table_steal (session->early, GUINT_TO_POINTER (load->id));
  if (load->file)
    read_file (fd, load->visit->cancellable, on_load_read, load);
  else
    {
      GInputStream *stream = g_unix_input_stream_new (fd, TRUE);
      read_stream (stream, G_MAXUINT, load->visit->cancellable, on_load_read, load);
      g_object_unref (stream);
    }
}

/* One load at a time, in item order: the lines come out in a fixed order, and the next
 * load starts only once the previous one's outcome is known. */
static void
load_next (Visit *visit)
{
  Session *session = visit->session;
  Choice *choice;
  Load *load;

  if (visit->next_choice >= session->choices->len)
    {
      drag_broker_broker1_session_call_conclude (session->proxy, NULL, on_concluded, visit_ref (visit));
      return;
    }
  choice = &g_array_index (session->choices, Choice, visit->next_choice++);
  load = g_new0 (Load, 1);
  load->visit = visit_ref (visit);
  load->item = choice->item;
  load->type = g_strdup (choice->type);
  drag_broker_broker1_session_call_load (session->proxy, load->item, load->type, NULL, NULL, on_load_reply, load);
}

static void
on_dropped (GObject *object, GAsyncResult *result, gpointer user_data)
{
  Visit *visit = user_data;
  GError *error = NULL;
  gchar *operation = NULL;

  if (!drag_broker_broker1_session_call_perform_drop_finish (DRAG_BROKER_BROKER1_SESSION (object), &operation, result,
                                                             &error))
    {
      report ("PerformDrop", error);
      g_error_free (error);
      show ("The broker refused the drop");
      visit_finish (visit, 0);
      visit->session->entered = FALSE;
      visit_unref (visit);
      return;
    }
  /* The proposal became the drop: there is nothing left to Exit from. */
  visit->session->entered = FALSE;
  say ("DROPPED %s", operation);
  visit->operation = action_for (operation);
  g_free (operation);
  load_next (visit);
  visit_unref (visit);
}

static void
perform_drop (Visit *visit)
{
  if (visit->dropping)
    return;
  visit->dropping = TRUE;
  drag_broker_broker1_session_call_perform_drop (visit->session->proxy, NULL, on_dropped, visit_ref (visit));
}

/* ---- GtkDropTargetAsync ---- */

static GdkDragAction
on_drag_enter (GtkDropTargetAsync *target, GdkDrop *drop, double x, double y, gpointer user_data)
{
  static const char *token_types[] = { TOKEN_TYPE, NULL };
  Visit *visit = g_new0 (Visit, 1);

  (void) target;
  (void) x;
  (void) y;
  (void) user_data;
  visit->refs = 1;
  visit->drop = g_object_ref (drop);
  visit->cancellable = g_cancellable_new ();
  if (app.visit != NULL)
    visit_unref (app.visit);
  app.visit = visit;
  show ("Asking the broker…");
  gdk_drop_read_async (drop, token_types, G_PRIORITY_DEFAULT, visit->cancellable, on_token_stream, visit_ref (visit));
  /* Refused until the broker answers. */
  return 0;
}

static GdkDragAction
on_drag_motion (GtkDropTargetAsync *target, GdkDrop *drop, double x, double y, gpointer user_data)
{
  Visit *visit = app.visit;

  (void) target;
  (void) x;
  (void) y;
  (void) user_data;
  if (visit == NULL || visit->drop != drop)
    return 0;
  /* Only a changed proposal goes to the broker; the position means nothing to it. */
  if (visit->session != NULL && visit->session->entered && !visit->proposing && !visit->drop_requested
      && g_strcmp0 (visit->proposal, wanted_proposal (visit)) != 0)
    {
      g_free (visit->proposal);
      visit->proposal = g_strdup (wanted_proposal (visit));
      visit->proposing = TRUE;
      drag_broker_broker1_session_call_update (visit->session->proxy, visit->proposal, NULL, on_updated,
                                               visit_ref (visit));
    }
  return visit->answer;
}

static void
on_drag_leave (GtkDropTargetAsync *target, GdkDrop *drop, gpointer user_data)
{
  Visit *visit = app.visit;

  (void) target;
  (void) user_data;
  if (visit == NULL || visit->drop != drop)
    return;
  app.visit = NULL;
  visit->left = TRUE;
  if (!visit->drop_requested)
    {
      show ("Drop here");
      if (visit->session != NULL && visit->session->entered && !visit->proposing)
        session_defer_exit (visit->session);
    }
  visit_unref (visit);
}

static gboolean
on_drop (GtkDropTargetAsync *target, GdkDrop *drop, double x, double y, gpointer user_data)
{
  Visit *visit = app.visit;

  (void) target;
  (void) x;
  (void) y;
  (void) user_data;
  if (visit == NULL || visit->drop != drop)
    {
      gdk_drop_finish (drop, 0);
      return TRUE;
    }
  visit->drop_requested = TRUE;
  show ("Receiving…");
  if (visit->failed)
    visit_finish (visit, 0);
  else if (visit->session != NULL)
    {
      g_clear_handle_id (&visit->session->exit_timer, g_source_remove);
      if (visit->session->decided && visit->session->failed)
        visit_finish (visit, 0);
      /* Whatever happened since the answer (another client dropped first, the source gave
       * up), the broker judges the drop; its refusal fails it. */
      else if (visit->session->decided && !visit->proposing)
        perform_drop (visit);
      /* Otherwise the answer to Enter, still on its way, performs the drop. */
    }
  /* With no session yet, the token is still being read; its end performs or fails the drop. */
  return TRUE;
}

/* ---- The window ---- */

static void
on_map (GtkWidget *window, gpointer user_data)
{
  (void) window;
  (void) user_data;
  if (app.ready)
    return;
  app.ready = TRUE;
  say ("READY");
}

static void
on_destroy (GtkWidget *window, gpointer user_data)
{
  (void) window;
  (void) user_data;
  g_main_loop_quit (app.loop);
}

static GDBusConnection *
connect_bus (GError **error)
{
  const gchar *address = g_getenv ("DRAGBROKER_BUS_ADDRESS");

  if (address != NULL && *address != '\0')
    return g_dbus_connection_new_for_address_sync (
        address, G_DBUS_CONNECTION_FLAGS_AUTHENTICATION_CLIENT | G_DBUS_CONNECTION_FLAGS_MESSAGE_BUS_CONNECTION, NULL,
        NULL, error);
  return g_bus_get_sync (G_BUS_TYPE_SESSION, NULL, error);
}

int
main (int argc, char **argv)
{
  gchar *title = NULL;
  GOptionEntry entries[] = {
    { "title", 0, 0, G_OPTION_ARG_STRING, &title, "Window title", "TITLE" },
    { "accept", 0, 0, G_OPTION_ARG_STRING_ARRAY, &app.accept, "A type to accept: MIME, wildcard (image/*) or UTI",
      "TYPE" },
    { NULL, 0, 0, 0, NULL, NULL, NULL },
  };
  GOptionContext *context = g_option_context_new ("- a GTK 4 drop target for dragbroker drags");
  GError *error = NULL;
  GtkDropTargetAsync *target;
  GdkContentFormats *formats;
  GtkWidget *column;
  gchar *accepts, *text;

  g_option_context_add_main_entries (context, entries, NULL);
  if (!g_option_context_parse (context, &argc, &argv, &error) || app.accept == NULL || app.accept[0] == NULL)
    {
      fprintf (stderr, "gtk4-target: %s\n", error != NULL ? error->message : "give at least one --accept TYPE");
      return 2;
    }
  g_option_context_free (context);
  setvbuf (stdout, NULL, _IOLBF, 0);
  /* Before any call: GDBus maps an error reply through the domains registered by then. */
  dragbroker_error_quark ();

  /* Connecting before the window exists keeps the one blocking wait off a live window. */
  app.bus = connect_bus (&error);
  if (app.bus == NULL)
    {
      fprintf (stderr, "gtk4-target: connecting to the bus: %s\n", error->message);
      return 1;
    }
  app.manager = drag_broker_broker1_manager_proxy_new_sync (app.bus, G_DBUS_PROXY_FLAGS_DO_NOT_LOAD_PROPERTIES
                                                                         | G_DBUS_PROXY_FLAGS_DO_NOT_CONNECT_SIGNALS,
                                                            BROKER_NAME, MANAGER_PATH, NULL, &error);
  if (app.manager == NULL)
    {
      fprintf (stderr, "gtk4-target: reaching the broker: %s\n", error->message);
      return 1;
    }

  gtk_init ();
  app.loop = g_main_loop_new (NULL, FALSE);
  app.window = gtk_window_new ();
  gtk_window_set_title (GTK_WINDOW (app.window), title != NULL ? title : "dragbroker C target");
  gtk_window_set_default_size (GTK_WINDOW (app.window), 340, 300);
  column = gtk_box_new (GTK_ORIENTATION_VERTICAL, 8);
  accepts = g_strjoinv (", ", app.accept);
  text = g_strdup_printf ("Accepts %s", accepts);
  gtk_box_append (GTK_BOX (column), gtk_label_new (text));
  g_free (text);
  g_free (accepts);
  app.picture = gtk_picture_new ();
  gtk_widget_set_vexpand (app.picture, TRUE);
  gtk_box_append (GTK_BOX (column), app.picture);
  app.label = gtk_label_new ("Drop here");
  gtk_box_append (GTK_BOX (column), app.label);
  gtk_window_set_child (GTK_WINDOW (app.window), column);

  /* GtkDropTarget deals in GTypes only; a private MIME type needs the async target. Its
   * default accept handler keeps out every drag that does not offer the token type. */
  formats = gdk_content_formats_new ((const char *[]) { TOKEN_TYPE }, 1);
  target = gtk_drop_target_async_new (formats, GDK_ACTION_COPY | GDK_ACTION_MOVE);
  g_signal_connect (target, "drag-enter", G_CALLBACK (on_drag_enter), NULL);
  g_signal_connect (target, "drag-motion", G_CALLBACK (on_drag_motion), NULL);
  g_signal_connect (target, "drag-leave", G_CALLBACK (on_drag_leave), NULL);
  g_signal_connect (target, "drop", G_CALLBACK (on_drop), NULL);
  app.area = column;
  gtk_widget_add_controller (column, GTK_EVENT_CONTROLLER (target));

  g_signal_connect (app.window, "map", G_CALLBACK (on_map), NULL);
  g_signal_connect (app.window, "destroy", G_CALLBACK (on_destroy), NULL);
  gtk_window_present (GTK_WINDOW (app.window));
  g_main_loop_run (app.loop);

  if (app.session != NULL)
    session_forget (app.session);
  g_object_unref (app.manager);
  g_object_unref (app.bus);
  g_main_loop_unref (app.loop);
  g_strfreev (app.accept);
  g_free (title);
  return 0;
}
