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
