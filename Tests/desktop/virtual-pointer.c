/*
 * A pointer for a headless wlroots compositor. The headless seat has no input device, so its
 * clients never get a wl_pointer; a zwlr_virtual_pointer_v1 gives the seat one, and its
 * motion reaches the app under it (sway's IPC can press a button but its cursor motion does
 * not, so a drag never starts that way).
 *
 *     virtual-pointer WIDTH HEIGHT
 *
 * WIDTH and HEIGHT are the layout's size, the extent of absolute positions. Reads commands
 * from stdin, one a line: "abs X Y", "move DX DY", "down", "up" (the left button). Each is
 * sent with a frame and acknowledged with "ok <command>" once the compositor has it.
 *
 * Events are kept at least 10 ms apart: with less, a release can reach sway before GTK's
 * start_drag, which wlroots then rejects and GTK reports as a failed drag.
 *
 * Built with the client header and glue that wayland-scanner makes from
 * wlr-virtual-pointer-unstable-v1.xml (Tests/desktop/build-virtual-pointer.sh).
 */
#define _POSIX_C_SOURCE 200809L
#include <linux/input-event-codes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <wayland-client.h>

#include "wlr-virtual-pointer-unstable-v1-client-protocol.h"

#define MINIMUM_GAP_NS 10000000LL

static struct wl_seat *seat;
static struct zwlr_virtual_pointer_manager_v1 *manager;

static void global_added(void *data, struct wl_registry *registry, uint32_t name, const char *interface, uint32_t version) {
    (void)data;
    (void)version;
    if (strcmp(interface, wl_seat_interface.name) == 0 && seat == NULL) {
        seat = wl_registry_bind(registry, name, &wl_seat_interface, 1);
    } else if (strcmp(interface, zwlr_virtual_pointer_manager_v1_interface.name) == 0) {
        manager = wl_registry_bind(registry, name, &zwlr_virtual_pointer_manager_v1_interface, 1);
    }
}

static void global_removed(void *data, struct wl_registry *registry, uint32_t name) {
    (void)data;
    (void)registry;
    (void)name;
}

static const struct wl_registry_listener registry_listener = {global_added, global_removed};

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void keep_gap(long long *last) {
    long long wait = *last + MINIMUM_GAP_NS - now_ns();
    if (wait > 0) {
        struct timespec ts = {wait / 1000000000LL, wait % 1000000000LL};
        nanosleep(&ts, NULL);
    }
    *last = now_ns();
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s WIDTH HEIGHT\n", argv[0]);
        return 2;
    }
    uint32_t width = (uint32_t)strtoul(argv[1], NULL, 10), height = (uint32_t)strtoul(argv[2], NULL, 10);
    struct wl_display *display = wl_display_connect(NULL);
    if (display == NULL) {
        fprintf(stderr, "virtual-pointer: cannot connect to the Wayland display\n");
        return 1;
    }
    struct wl_registry *registry = wl_display_get_registry(display);
    wl_registry_add_listener(registry, &registry_listener, NULL);
    wl_display_roundtrip(display);
    if (manager == NULL) {
        fprintf(stderr, "virtual-pointer: the compositor has no zwlr_virtual_pointer_manager_v1\n");
        return 1;
    }
    struct zwlr_virtual_pointer_v1 *pointer = zwlr_virtual_pointer_manager_v1_create_virtual_pointer(manager, seat);
    wl_display_roundtrip(display);
    printf("ready\n");
    fflush(stdout);

    long long last = 0;
    double x = 0, y = 0;
    char line[256];
    while (fgets(line, sizeof line, stdin) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        double a, b;
        keep_gap(&last);
        uint32_t time_ms = (uint32_t)(now_ns() / 1000000LL);
        if (sscanf(line, "abs %lf %lf", &a, &b) == 2) {
            x = a;
            y = b;
            zwlr_virtual_pointer_v1_motion_absolute(pointer, time_ms, (uint32_t)x, (uint32_t)y, width, height);
        } else if (sscanf(line, "move %lf %lf", &a, &b) == 2) {
            x += a;
            y += b;
            zwlr_virtual_pointer_v1_motion(pointer, time_ms, wl_fixed_from_double(a), wl_fixed_from_double(b));
        } else if (strcmp(line, "down") == 0) {
            zwlr_virtual_pointer_v1_button(pointer, time_ms, BTN_LEFT, WL_POINTER_BUTTON_STATE_PRESSED);
        } else if (strcmp(line, "up") == 0) {
            zwlr_virtual_pointer_v1_button(pointer, time_ms, BTN_LEFT, WL_POINTER_BUTTON_STATE_RELEASED);
        } else {
            printf("error unknown command: %s\n", line);
            fflush(stdout);
            continue;
        }
        zwlr_virtual_pointer_v1_frame(pointer);
        if (wl_display_roundtrip(display) < 0) {
            fprintf(stderr, "virtual-pointer: the compositor went away\n");
            return 1;
        }
        printf("ok %s\n", line);
        fflush(stdout);
    }
    zwlr_virtual_pointer_v1_destroy(pointer);
    wl_display_roundtrip(display);
    wl_display_disconnect(display);
    return 0;
}
