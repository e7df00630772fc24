/* A node's wall clock, as the nemesis of `fleet bench partition` jumps it (fleet/ops/nodes.py, issue 39).

   Preloaded (LD_PRELOAD) into a node's Fleet processes: CLOCK_REALTIME, as they read it, is the machine's plus the
   seconds written in the file FLEET_CLOCK_FILE names (read again at most every 0.2 s of the monotonic clock, so that
   a change reaches running processes). The monotonic clocks and every sleep are left alone, as a real step of the
   wall clock (NTP, an operator's `date -s`) leaves them. Debian's libfaketime cannot do this for Python 3.11: left
   the monotonic clock, its clock_nanosleep hands the kernel a negative time and every time.sleep() fails with
   EINVAL (wolfcw/libfaketime#426). Built by Bed.up() with the machine's C compiler. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define REREAD_NS 200000000LL

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static clock_gettime_fn real_clock_gettime;
static long long offset_ns;  /* read and written with __atomic: any thread may read the file again */
static long long read_at_ns = -REREAD_NS;

static long long ns_of(const struct timespec *ts) { return ts->tv_sec * 1000000000LL + ts->tv_nsec; }

static clock_gettime_fn real(void) {
    if (real_clock_gettime == NULL)
        real_clock_gettime = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    return real_clock_gettime;
}

/* The offset in the file, or the last one read while the file is missing or being rewritten. */
static long long offset(void) {
    struct timespec mono;
    real()(CLOCK_MONOTONIC, &mono);
    long long now = ns_of(&mono);
    if (now - __atomic_load_n(&read_at_ns, __ATOMIC_RELAXED) < REREAD_NS)
        return __atomic_load_n(&offset_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&read_at_ns, now, __ATOMIC_RELAXED);
    const char *path = getenv("FLEET_CLOCK_FILE");
    int fd = path ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    if (fd >= 0) {
        char text[64];
        ssize_t got = read(fd, text, sizeof text - 1);
        close(fd);
        if (got > 0) {
            text[got] = '\0';
            char *end;
            double seconds = strtod(text, &end);
            if (end != text)
                __atomic_store_n(&offset_ns, (long long)(seconds * 1e9), __ATOMIC_RELAXED);
        }
    }
    return __atomic_load_n(&offset_ns, __ATOMIC_RELAXED);
}

static void shift(struct timespec *ts) {
    long long shifted = ns_of(ts) + offset();
    ts->tv_sec = shifted / 1000000000LL;
    ts->tv_nsec = shifted % 1000000000LL;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    int done = real()(clock, ts);
    if (done == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE))
        shift(ts);
    return done;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out != NULL)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
