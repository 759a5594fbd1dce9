/*
 * A wall clock off by a set number of seconds, for one process and its
 * children: preloaded (LD_PRELOAD), it adds TIMESHARE_CLOCK_SKEW_SECONDS
 * (a decimal, negative: behind) to CLOCK_REALTIME as clock_gettime,
 * gettimeofday and time give it. Monotonic clocks are left alone, as a
 * machine whose NTP is off keeps them. timeshare.testing.clock_skew builds it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static long long skew_ns(void) {
    static int read = 0;
    static long long skew = 0;
    if (!read) {
        const char *text = getenv("TIMESHARE_CLOCK_SKEW_SECONDS");
        skew = text ? (long long)(strtod(text, NULL) * 1e9) : 0;
        read = 1;
    }
    return skew;
}

static int real_clock_gettime(clockid_t clock, struct timespec *now) {
    static clock_gettime_fn real = NULL;
    if (!real) {
        real = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    }
    return real(clock, now);
}

static void shift(struct timespec *now) {
    long long ns = (long long)now->tv_sec * 1000000000LL + now->tv_nsec + skew_ns();
    now->tv_sec = (time_t)(ns / 1000000000LL);
    now->tv_nsec = (long)(ns % 1000000000LL);
    if (now->tv_nsec < 0) {
        now->tv_nsec += 1000000000L;
        now->tv_sec -= 1;
    }
}

__attribute__((visibility("default"))) int clock_gettime(clockid_t clock, struct timespec *now) {
    int result = real_clock_gettime(clock, now);
    if (result == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) {
        shift(now);
    }
    return result;
}

__attribute__((visibility("default"))) int gettimeofday(struct timeval *now, void *zone) {
    (void)zone;
    struct timespec spec;
    int result = clock_gettime(CLOCK_REALTIME, &spec);
    if (result == 0 && now) {
        now->tv_sec = spec.tv_sec;
        now->tv_usec = spec.tv_nsec / 1000;
    }
    return result;
}

__attribute__((visibility("default"))) time_t time(time_t *out) {
    struct timespec spec;
    clock_gettime(CLOCK_REALTIME, &spec);
    if (out) {
        *out = spec.tv_sec;
    }
    return spec.tv_sec;
}
