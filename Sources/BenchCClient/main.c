/* The bench's baseline destination: the calls BrokerClient makes for a drop, made by the
 * plainest client there is, C on sd-bus with blocking calls and no thread of its own. What
 * BrokerClient costs on top of this is the library's own overhead (make bench prints it as
 * client_*_vs_c). It deliberately does not use BusKit: it is the yardstick, not the product.
 * Each KIND also comes as KIND-loop: the same calls made as an asynchronous C client makes
 * them, sd_bus_call_method_async on an sd-event loop attached to the bus, waiting in
 * sd_event_run (and for the first byte, an io source on the pipe), as BrokerClient does.
 *
 * Usage: dragbroker-bench-c ADDRESS TOKEN ECHO-PEER SMALL-TYPE FILE-TYPE CAPACITY PAUSE-US
 * It presents TOKEN, prints "READY", then answers each command on stdin with one line. KIND is
 *   update     Enter(copy) on first use, then Update(copy) round trips
 *   firstbyte  Load(0, SMALL-TYPE) to the first byte read, each read to its end
 *   handover   Load(0, FILE-TYPE) to the descriptor in hand
 *   update-loop, firstbyte-loop, handover-loop  the same on the event loop
 * and the commands are
 *   warmup KIND N   N operations, each followed by an echo, not recorded  -> "OK warmup KIND"
 *   block KIND N    N recorded pairs (at most CAPACITY in all per KIND)    -> "OK block KIND"
 *   report KIND     the pairs recorded so far, which it then forgets
 *                   -> "OK KIND N P50 P99 ECHO-P50 ECHO-P99 CPU-US SWITCHES"
 *   drop            Enter(copy) unless done already, then PerformDrop     -> "OK drop"
 *   quit            Conclude, then exit
 * Blocks let the Swift side alternate with its own measurement of the same kind, so that both
 * see the same machine. Times are nanoseconds. A recorded pair is a pause of PAUSE-US
 * microseconds (none at 0), the operation, the pause again and an echo
 * (org.freedesktop.DBus.Peer.Ping to ECHO-PEER), as the Swift side measures. CPU-US is the
 * CPU time this thread used over all the recorded blocks (user and system, microseconds),
 * SWITCHES how often the kernel took the CPU from it while it could still run (involuntary
 * context switches). Failures print "ERR <what>" and exit 1. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-bus.h>
#include <systemd/sd-event.h>

static const char *BROKER = "org.dragbroker.Broker1";
static const char *MANAGER_PATH = "/org/dragbroker/Broker1";
static const char *MANAGER = "org.dragbroker.Broker1.Manager";
static const char *SESSION = "org.dragbroker.Broker1.Session";

static sd_bus *bus;
static sd_event *event;
static char *session_path;
static const char *echo_peer, *small_type, *file_type;
static long capacity;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void die(const char *what, int r) {
    printf("ERR %s: %s\n", what, strerror(r < 0 ? -r : r));
    fflush(stdout);
    exit(1);
}

static void die_call(const char *what, const sd_bus_error *error, int r) {
    printf("ERR %s: %s %s\n", what, error && error->name ? error->name : "", error && error->message ? error->message : strerror(-r));
    fflush(stdout);
    exit(1);
}

/* The signals the broker sends this destination (LoadProgress, LoadFinished) wait in sd-bus's
 * queue while a blocking call runs; nothing here needs them, so they are let go. */
static void drain(void) {
    int r;
    while ((r = sd_bus_process(bus, NULL)) > 0) {}
    if (r < 0) die("sd_bus_process", r);
}

static long pause_us;

static void settle(void) {
    struct timespec pause = {pause_us / 1000000, (pause_us % 1000000) * 1000};
    while (pause_us > 0 && nanosleep(&pause, &pause) < 0 && errno == EINTR) {}
    drain();
}

static void echo(void) {
    sd_bus_error error = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    int r = sd_bus_call_method(bus, echo_peer, "/", "org.freedesktop.DBus.Peer", "Ping", &error, &reply, "");
    if (r < 0) die_call("Ping", &error, r);
    sd_bus_message_unref(reply);
}

static const char *propose(const char *member) {
    static char answer[32];
    sd_bus_error error = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    const char *allowed;
    int r = sd_bus_call_method(bus, BROKER, session_path, SESSION, member, &error, &reply, "s", "copy");
    if (r < 0) die_call(member, &error, r);
    r = sd_bus_message_read(reply, "s", &allowed);
    if (r < 0) die("reading the proposal's answer", r);
    snprintf(answer, sizeof answer, "%s", allowed);
    sd_bus_message_unref(reply);
    return answer;
}

/* The descriptor of Load's reply, owned by the caller; releases the reply. */
static int take_descriptor(sd_bus_message *reply) {
    int fd;
    uint32_t id;
    const char *kind;
    int r = sd_bus_message_read(reply, "hus", &fd, &id, &kind);
    if (r < 0) die("reading Load's reply", r);
    /* The descriptor belongs to the message. */
    fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (fd < 0) die("F_DUPFD_CLOEXEC", errno);
    sd_bus_message_unref(reply);
    return fd;
}

/* Load(0, type): the destination's descriptor, owned by the caller. */
static int load(const char *type) {
    sd_bus_error error = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    int r = sd_bus_call_method(bus, BROKER, session_path, SESSION, "Load", &error, &reply, "us", (uint32_t)0, type);
    if (r < 0) die_call("Load", &error, r);
    return take_descriptor(reply);
}

/* Enter(copy), the first time only: Update and PerformDrop both follow it. */
static void enter_once(void) {
    static int entered;
    if (entered) return;
    if (strcmp(propose("Enter"), "copy") != 0) die("Enter was not answered copy", EPROTO);
    entered = 1;
}

static uint64_t op_update(void) {
    uint64_t start = now_ns();
    const char *allowed = propose("Update");
    uint64_t elapsed = now_ns() - start;
    if (strcmp(allowed, "copy") != 0) die("Update was not answered copy", EPROTO);
    return elapsed;
}

static char buffer[1 << 20];

/* Reads the load to its end and closes it; `*first` gets the time of its first byte if it
   has none yet. */
static void read_to_end(int fd, uint64_t *first) {
    for (;;) {
        ssize_t n = read(fd, buffer, sizeof buffer);
        if (n > 0) {
            if (*first == 0) *first = now_ns();
            continue;
        }
        if (n == 0) break;
        if (errno == EINTR) continue;
        die("reading the load", errno);
    }
    close(fd);
    if (*first == 0) die("the load delivered no byte", EPROTO);
}

static uint64_t op_first_byte(void) {
    uint64_t start = now_ns(), first = 0;
    read_to_end(load(small_type), &first);
    return first - start;
}

/* Load(0, FILE-TYPE) through `load_file` to the descriptor in hand. */
static uint64_t timed_handover(int (*load_file)(const char *)) {
    uint64_t start = now_ns();
    int fd = load_file(file_type);
    uint64_t elapsed = now_ns() - start;
    close(fd);
    return elapsed;
}

static uint64_t op_handover(void) { return timed_handover(load); }

/* One asynchronous call's outcome, filled in by its reply callback on the loop. */
struct pending {
    sd_bus_message *reply;
    int done;
};

static int on_reply(sd_bus_message *reply, void *userdata, sd_bus_error *error) {
    (void)error;
    struct pending *pending = userdata;
    pending->reply = sd_bus_message_ref(reply);
    pending->done = 1;
    return 0;
}

/* Runs the loop until the call's reply arrived; dies on an error reply. */
static sd_bus_message *await_reply(struct pending *pending, const char *what) {
    while (!pending->done) {
        int r = sd_event_run(event, UINT64_MAX);
        if (r < 0) die("sd_event_run", r);
    }
    const sd_bus_error *error = sd_bus_message_get_error(pending->reply);
    if (error) die_call(what, error, -EIO);
    return pending->reply;
}

static uint64_t op_update_loop(void) {
    uint64_t start = now_ns();
    struct pending pending = {0};
    int r = sd_bus_call_method_async(bus, NULL, BROKER, session_path, SESSION, "Update", on_reply, &pending, "s", "copy");
    if (r < 0) die("Update", r);
    sd_bus_message *reply = await_reply(&pending, "Update");
    const char *allowed;
    if ((r = sd_bus_message_read(reply, "s", &allowed)) < 0) die("reading the proposal's answer", r);
    int copy = strcmp(allowed, "copy") == 0;
    sd_bus_message_unref(reply);
    uint64_t elapsed = now_ns() - start;
    if (!copy) die("Update was not answered copy", EPROTO);
    return elapsed;
}

/* Load(0, type) on the loop: the destination's descriptor, owned by the caller. */
static int load_loop(const char *type) {
    struct pending pending = {0};
    int r = sd_bus_call_method_async(bus, NULL, BROKER, session_path, SESSION, "Load", on_reply, &pending, "us", (uint32_t)0, type);
    if (r < 0) die("Load", r);
    return take_descriptor(await_reply(&pending, "Load"));
}

static int on_readable(sd_event_source *source, int fd, uint32_t revents, void *userdata) {
    (void)source;
    (void)revents;
    uint64_t *first = userdata;
    ssize_t n = read(fd, buffer, sizeof buffer);
    if (n > 0) *first = now_ns();
    else if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
    else die("the load delivered no byte", n < 0 ? errno : EPROTO);
    return 0;
}

static uint64_t op_first_byte_loop(void) {
    uint64_t start = now_ns(), first = 0;
    int fd = load_loop(small_type);
    sd_event_source *source = NULL;
    int r = sd_event_add_io(event, &source, fd, EPOLLIN, on_readable, &first);
    if (r < 0) die("sd_event_add_io", r);
    while (first == 0) {
        if ((r = sd_event_run(event, UINT64_MAX)) < 0) die("sd_event_run", r);
    }
    sd_event_source_disable_unref(source);
    read_to_end(fd, &first);
    return first - start;
}

static uint64_t op_handover_loop(void) { return timed_handover(load_loop); }

static int compare(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t percentile(uint64_t *values, long count, double p) {
    long index = (long)(p / 100.0 * (double)count + 0.5) - 1;
    if (index < 0) index = 0;
    if (index >= count) index = count - 1;
    return values[index];
}

/* What has been recorded of one kind of operation since its last report. */
struct record {
    const char *name;
    uint64_t (*op)(void);
    uint64_t *ops, *echoes;
    long count;
    uint64_t cpu_us;
    long switches;
};

static struct record records[] = {
    {"update", op_update, NULL, NULL, 0, 0, 0},
    {"firstbyte", op_first_byte, NULL, NULL, 0, 0, 0},
    {"handover", op_handover, NULL, NULL, 0, 0, 0},
    {"update-loop", op_update_loop, NULL, NULL, 0, 0, 0},
    {"firstbyte-loop", op_first_byte_loop, NULL, NULL, 0, 0, 0},
    {"handover-loop", op_handover_loop, NULL, NULL, 0, 0, 0},
};

static struct record *record_named(const char *name) {
    for (size_t i = 0; i < sizeof records / sizeof records[0]; i++)
        if (strcmp(records[i].name, name) == 0) return &records[i];
    return NULL;
}

static void warm(struct record *record, long count) {
    for (long i = 0; i < count; i++) {
        record->op();
        echo();
    }
}

static struct rusage thread_usage(void) {
    struct rusage usage;
    if (getrusage(RUSAGE_THREAD, &usage) < 0) die("getrusage", errno);
    return usage;
}

static uint64_t micros(struct timeval t) { return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_usec; }

/* Alternates op and echo as the Swift side's measurePaired does. */
static void block(struct record *record, long count) {
    if (count > capacity - record->count) die("more pairs than CAPACITY", EOVERFLOW);
    struct rusage before = thread_usage();
    for (long i = 0; i < count; i++) {
        settle();
        record->ops[record->count] = record->op();
        settle();
        uint64_t start = now_ns();
        echo();
        record->echoes[record->count] = now_ns() - start;
        record->count++;
    }
    struct rusage after = thread_usage();
    record->cpu_us += micros(after.ru_utime) + micros(after.ru_stime) - micros(before.ru_utime) - micros(before.ru_stime);
    record->switches += after.ru_nivcsw - before.ru_nivcsw;
}

static void report(struct record *record) {
    long count = record->count;
    if (count == 0) die("nothing recorded to report", ENODATA);
    qsort(record->ops, (size_t)count, sizeof *record->ops, compare);
    qsort(record->echoes, (size_t)count, sizeof *record->echoes, compare);
    printf("OK %s %ld %llu %llu %llu %llu %llu %ld\n", record->name, count, (unsigned long long)percentile(record->ops, count, 50),
           (unsigned long long)percentile(record->ops, count, 99), (unsigned long long)percentile(record->echoes, count, 50),
           (unsigned long long)percentile(record->echoes, count, 99), (unsigned long long)record->cpu_us, record->switches);
    record->count = 0;
    record->cpu_us = 0;
    record->switches = 0;
}

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: %s ADDRESS TOKEN ECHO-PEER SMALL-TYPE FILE-TYPE CAPACITY PAUSE-US\n", argv[0]);
        return 2;
    }
    echo_peer = argv[3];
    small_type = argv[4];
    file_type = argv[5];
    capacity = atol(argv[6]);
    pause_us = atol(argv[7]);
    if (capacity <= 0) die("CAPACITY must be positive", EINVAL);
    for (size_t i = 0; i < sizeof records / sizeof records[0]; i++) {
        records[i].ops = calloc((size_t)capacity, sizeof *records[i].ops);
        records[i].echoes = calloc((size_t)capacity, sizeof *records[i].echoes);
        if (!records[i].ops || !records[i].echoes) die("calloc", ENOMEM);
    }

    int r = sd_bus_new(&bus);
    if (r < 0) die("sd_bus_new", r);
    if ((r = sd_bus_set_address(bus, argv[1])) < 0) die("sd_bus_set_address", r);
    if ((r = sd_bus_set_bus_client(bus, 1)) < 0) die("sd_bus_set_bus_client", r);
    if ((r = sd_bus_start(bus)) < 0) die("sd_bus_start", r);
    if ((r = sd_event_new(&event)) < 0) die("sd_event_new", r);
    if ((r = sd_bus_attach_event(bus, event, SD_EVENT_PRIORITY_NORMAL)) < 0) die("sd_bus_attach_event", r);

    sd_bus_error error = SD_BUS_ERROR_NULL;
    sd_bus_message *reply = NULL;
    const char *path;
    r = sd_bus_call_method(bus, BROKER, MANAGER_PATH, MANAGER, "PresentToken", &error, &reply, "s", argv[2]);
    if (r < 0) die_call("PresentToken", &error, r);
    if ((r = sd_bus_message_read(reply, "o", &path)) < 0) die("reading PresentToken's reply", r);
    session_path = strdup(path);
    sd_bus_message_unref(reply);
    printf("READY %s\n", session_path);
    fflush(stdout);

    char line[64], command[16], kind[16];
    long count;
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        int words = sscanf(line, "%15s %15s %ld", command, kind, &count);
        struct record *record = words >= 2 ? record_named(kind) : NULL;
        if (words == 3 && record && count >= 0 && strcmp(command, "warmup") == 0) {
            if (record->op == op_update || record->op == op_update_loop) enter_once();
            warm(record, count);
            printf("OK warmup %s\n", kind);
        } else if (words == 3 && record && count >= 0 && strcmp(command, "block") == 0) {
            if (record->op == op_update || record->op == op_update_loop) enter_once();
            block(record, count);
            printf("OK block %s\n", kind);
        } else if (words == 2 && record && strcmp(command, "report") == 0) {
            report(record);
        } else if (strcmp(line, "drop") == 0) {
            enter_once();
            reply = NULL;
            r = sd_bus_call_method(bus, BROKER, session_path, SESSION, "PerformDrop", &error, &reply, "");
            if (r < 0) die_call("PerformDrop", &error, r);
            sd_bus_message_unref(reply);
            printf("OK drop\n");
        } else if (strcmp(line, "quit") == 0) {
            drain();
            reply = NULL;
            r = sd_bus_call_method(bus, BROKER, session_path, SESSION, "Conclude", &error, &reply, "");
            if (r < 0) die_call("Conclude", &error, r);
            sd_bus_message_unref(reply);
            break;
        } else {
            printf("ERR unknown command '%s'\n", line);
        }
        fflush(stdout);
    }
    sd_bus_flush_close_unref(bus);
    sd_event_unref(event);
    return 0;
}
