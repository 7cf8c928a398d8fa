/* GTK 4 and GLib for BrokerGTK, with the few things Swift cannot reach directly. */
#include <gtk/gtk.h>
#include <glib-unix.h>

/* libdispatch's hooks for a foreign main loop, the ones CoreFoundation's run loop uses: an
   eventfd that becomes readable when the main queue has work, and the call that drains it.
   With them GTK's main loop runs Swift's main actor. */
extern int _dispatch_get_main_queue_handle_4CF(void);
extern void _dispatch_main_queue_callback_4CF(void *msg);

/* g_signal_connect is a macro. */
static inline gulong shim_signal_connect(gpointer instance, const char *signal, GCallback handler,
                                         gpointer data, GClosureNotify destroy) {
    return g_signal_connect_data(instance, signal, handler, data, destroy, 0);
}

/* gdk_content_provider_new_typed is variadic, and G_TYPE_STRING a macro: the clipboard's text,
   which GDK offers in every text format the toolkits read (UTF8_STRING, text/plain, …). */
static inline GdkContentProvider *shim_text_provider(const char *text) {
    return gdk_content_provider_new_typed(G_TYPE_STRING, text);
}

static inline gboolean shim_formats_contain_text(GdkContentFormats *formats) {
    return gdk_content_formats_contain_gtype(formats, G_TYPE_STRING);
}
