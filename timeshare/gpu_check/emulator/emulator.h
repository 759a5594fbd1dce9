/*
 * Shared pieces of the GPU emulator: configuration from the environment, the
 * JSON-lines call log, and the per-process records in the state directory that
 * libcuda.so.1 writes and libnvidia-ml.so.1 / the cuda-checkpoint utility read.
 *
 * State directory ($TIMESHARE_EMULATOR_DIR), one folder per CUDA process:
 *   <pid>/process   "<restore thread id> <process start time>"; written once at cuInit.
 *                   The start time (field 22 of /proc/<pid>/stat) guards against
 *                   pid reuse: a record whose start time no longer matches is stale.
 *   <pid>/state     running | locked | checkpointed | failed | checkpointing | restoring
 *                   (only the process itself, i.e. its restore thread, writes it)
 *   <pid>/gpu       one "<device> <bytes>" line per device the process holds a context
 *                   or memory on; empty while checkpointed (GPU resources released)
 *   faults          optional control file (see libcuda.c, "Fault injection")
 *   devices.lock    flock()ed while memory is reserved, so two processes cannot both
 *                   take the last free bytes of a device
 *
 * Every file is replaced atomically (write to a temporary name, then rename), so a
 * reader never sees half a record.
 */
#ifndef TIMESHARE_EMULATOR_H
#define TIMESHARE_EMULATOR_H

#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define EMU_MAX_GPUS 16

/* CUprocessState (cuda.h, CUDA 13.x): 4 and 5 are the in-progress states. */
enum {
    EMU_RUNNING = 0,
    EMU_LOCKED = 1,
    EMU_CHECKPOINTED = 2,
    EMU_FAILED = 3,
    EMU_CHECKPOINTING = 4,
    EMU_RESTORING = 5,
};

typedef struct {
    char dir[PATH_MAX];
    char log[PATH_MAX];
    char log_calls[512];
    char driver[32];
    char gpu_name[96];
    int gpus;
    int cuda_version;
    unsigned long long gpu_memory;
    unsigned long long reserved_bytes;
    unsigned long long copy_bytes_per_second;
    int lock_timeout_result;
    int nvml_memory_unavailable;
    int nvml_init_error;
    int utilization; /* -1: NVML_ERROR_NOT_SUPPORTED */
    int log_fd;
} emu_config;

static emu_config emu_cfg;
static pthread_once_t emu_cfg_once = PTHREAD_ONCE_INIT;

static inline const char *emu_env(const char *name, const char *fallback)
{
    const char *value = getenv(name);
    return value && *value ? value : fallback;
}

/* "85899345920", "80G", "81559M", "512K": binary units. */
static inline unsigned long long emu_parse_bytes(const char *text, unsigned long long fallback)
{
    char *end = NULL;
    if (!text || !*text)
        return fallback;
    unsigned long long value = strtoull(text, &end, 10);
    if (end == text)
        return fallback;
    switch (toupper((unsigned char)*end)) {
    case 'T': value <<= 40; break;
    case 'G': value <<= 30; break;
    case 'M': value <<= 20; break;
    case 'K': value <<= 10; break;
    default: break;
    }
    return value;
}

/* The CUDA version each driver branch ships (CUDA toolkit release notes, table
 * "CUDA Toolkit and Corresponding Driver Versions"). */
static inline int emu_cuda_for_driver(const char *driver)
{
    int major = atoi(driver);
    if (major >= 580) return 13000;
    if (major >= 575) return 12090;
    if (major >= 570) return 12080;
    if (major >= 565) return 12070;
    if (major >= 560) return 12060;
    if (major >= 555) return 12050;
    if (major >= 550) return 12040;
    return 12020;
}

static inline void emu_load_config(void)
{
    emu_config *c = &emu_cfg;
    char fallback_dir[PATH_MAX];
    snprintf(fallback_dir, sizeof fallback_dir, "%s/timeshare-emulator-%d",
             emu_env("TMPDIR", "/tmp"), (int)getuid());
    snprintf(c->dir, sizeof c->dir, "%s", emu_env("TIMESHARE_EMULATOR_DIR", fallback_dir));
    snprintf(c->log, sizeof c->log, "%s", emu_env("TIMESHARE_EMULATOR_LOG", ""));
    snprintf(c->log_calls, sizeof c->log_calls, "%s", emu_env("TIMESHARE_EMULATOR_LOG_CALLS", ""));
    snprintf(c->driver, sizeof c->driver, "%s", emu_env("TIMESHARE_EMULATOR_DRIVER", "580.65.06"));
    snprintf(c->gpu_name, sizeof c->gpu_name, "%s",
             emu_env("TIMESHARE_EMULATOR_GPU_NAME", "NVIDIA H100 80GB HBM3"));
    c->gpus = atoi(emu_env("TIMESHARE_EMULATOR_GPUS", "1"));
    if (c->gpus < 0) c->gpus = 0;
    if (c->gpus > EMU_MAX_GPUS) c->gpus = EMU_MAX_GPUS;
    c->cuda_version = atoi(emu_env("TIMESHARE_EMULATOR_CUDA_VERSION", "0"));
    if (c->cuda_version <= 0)
        c->cuda_version = emu_cuda_for_driver(c->driver);
    c->gpu_memory = emu_parse_bytes(getenv("TIMESHARE_EMULATOR_GPU_MEMORY"), 80ULL << 30);
    c->reserved_bytes = emu_parse_bytes(getenv("TIMESHARE_EMULATOR_RESERVED_MEMORY"), 0);
    c->copy_bytes_per_second = emu_parse_bytes(getenv("TIMESHARE_EMULATOR_COPY_RATE"), 0);
    /* CUDA_ERROR_NOT_READY (600): the one code the driver documents for
     * cuCheckpointProcessLock beyond the common ones, and the lock is the only call
     * with a timeout. Override (e.g. 909, CUDA_ERROR_TIMEOUT) to test a caller's
     * handling of another code. */
    c->lock_timeout_result = atoi(emu_env("TIMESHARE_EMULATOR_LOCK_TIMEOUT_RESULT", "600"));
    c->nvml_memory_unavailable =
        strcmp(emu_env("TIMESHARE_EMULATOR_NVML_PROCESS_MEMORY", "available"), "unavailable") == 0;
    c->nvml_init_error = atoi(emu_env("TIMESHARE_EMULATOR_NVML_INIT_ERROR", "0"));
    const char *utilization = emu_env("TIMESHARE_EMULATOR_UTILIZATION", "0");
    c->utilization = strcmp(utilization, "unsupported") == 0 ? -1 : atoi(utilization);
    c->log_fd = -1;
    if (c->log[0])
        c->log_fd = open(c->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

static inline emu_config *emu_config_get(void)
{
    pthread_once(&emu_cfg_once, emu_load_config);
    return &emu_cfg;
}

static inline long long emu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static inline void emu_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static inline int emu_log_wanted(const emu_config *c, const char *call)
{
    if (!c->log_calls[0])
        return 1;
    char filter[sizeof c->log_calls];
    snprintf(filter, sizeof filter, "%s", c->log_calls);
    char *save = NULL;
    for (char *prefix = strtok_r(filter, ",", &save); prefix; prefix = strtok_r(NULL, ",", &save))
        if (strncmp(call, prefix, strlen(prefix)) == 0)
            return 1;
    return 0;
}

/* One JSON line per phase of a call, written with a single write() on an O_APPEND
 * descriptor so lines of concurrent processes never interleave. `pid` is the target
 * process for cuCheckpointProcess* calls, the caller otherwise; `caller` is always
 * the process that made the call. A "begin" line has "result": null. */
static inline void emu_log(const char *call, int pid, const char *phase, int has_result, int result)
{
    emu_config *c = emu_config_get();
    if (c->log_fd < 0 || !emu_log_wanted(c, call))
        return;
    char line[512];
    long long now = emu_now_ns();
    char result_text[16] = "null";
    if (has_result)
        snprintf(result_text, sizeof result_text, "%d", result);
    int n = snprintf(line, sizeof line,
                     "{\"t\": %lld.%09lld, \"call\": \"%s\", \"pid\": %d, \"caller\": %d, "
                     "\"tid\": %d, \"result\": %s, \"phase\": \"%s\"}\n",
                     now / 1000000000LL, now % 1000000000LL, call, pid, (int)getpid(),
                     (int)gettid(), result_text, phase);
    if (n > 0 && n < (int)sizeof line) {
        ssize_t ignored = write(c->log_fd, line, (size_t)n);
        (void)ignored;
    }
}

static inline int emu_read_file(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t used = 0;
    while (used + 1 < size) {
        ssize_t n = read(fd, buf + used, size - 1 - used);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        used += (size_t)n;
    }
    close(fd);
    buf[used] = '\0';
    return (int)used;
}

static inline int emu_write_atomic(const char *path, const char *data)
{
    char tmp[PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.%d.%d.tmp", path, (int)getpid(), (int)gettid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    size_t length = strlen(data), done = 0;
    while (done < length) {
        ssize_t n = write(fd, data + done, length - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            close(fd);
            unlink(tmp);
            return -1;
        }
        done += (size_t)n;
    }
    close(fd);
    return rename(tmp, path);
}

/* Field 22 of /proc/<pid>/stat (proc(5)): the process start time; 0 if none. */
static inline unsigned long long emu_start_time(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if (emu_read_file(path, buf, sizeof buf) <= 0)
        return 0;
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    p++;
    /* after ")" come fields 3..: the start time is the 20th of them */
    for (int field = 3; field < 22 && p; field++) {
        p = strchr(p + 1, ' ');
    }
    return p ? strtoull(p + 1, NULL, 10) : 0;
}

/* The thread group (process) a thread id belongs to, from /proc/<tid>/status; -1 if
 * no such task. The driver accepts any thread's id as the process's: NVIDIA/cuda-checkpoint#41
 * ("2716 is a thread created in 2715, so it also exists in
 * /proc and can be used to checkpoint the process too"). */
static inline int emu_tgid(int pid)
{
    if (pid <= 0)
        return -1;
    char path[64], buf[2048];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    if (emu_read_file(path, buf, sizeof buf) <= 0)
        return -1;
    char *line = strstr(buf, "\nTgid:");
    return line ? atoi(line + 6) : -1;
}

static inline void emu_pid_path(int pid, const char *name, char *out, size_t size)
{
    snprintf(out, size, "%s/%d/%s", emu_config_get()->dir, pid, name);
}

/* Whether the process runs (or is stopped): an exited process that is not yet reaped
 * (a zombie, proc(5) state Z) has given up its GPU resources with everything else. */
static inline int emu_alive(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if (emu_read_file(path, buf, sizeof buf) <= 0)
        return 0;
    char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
}

/* A live CUDA process with a current record: its restore thread id, or -1. */
static inline int emu_record(int pid)
{
    char path[PATH_MAX], buf[128];
    emu_pid_path(pid, "process", path, sizeof path);
    if (emu_read_file(path, buf, sizeof buf) <= 0)
        return -1;
    int tid = 0;
    unsigned long long started = 0;
    if (sscanf(buf, "%d %llu", &tid, &started) != 2)
        return -1;
    if (started == 0 || emu_start_time(pid) != started || !emu_alive(pid))
        return -1;
    return tid;
}

static inline const char *emu_state_name(int state)
{
    switch (state) {
    case EMU_RUNNING: return "running";
    case EMU_LOCKED: return "locked";
    case EMU_CHECKPOINTED: return "checkpointed";
    case EMU_FAILED: return "failed";
    case EMU_CHECKPOINTING: return "checkpointing";
    case EMU_RESTORING: return "restoring";
    default: return "unknown";
    }
}

static inline int emu_state_parse(const char *text)
{
    for (int state = EMU_RUNNING; state <= EMU_RESTORING; state++) {
        const char *name = emu_state_name(state);
        if (strncmp(text, name, strlen(name)) == 0 && !isalpha((unsigned char)text[strlen(name)]))
            return state;
    }
    return -1;
}

static inline int emu_read_state(int pid)
{
    char path[PATH_MAX], buf[64];
    emu_pid_path(pid, "state", path, sizeof path);
    if (emu_read_file(path, buf, sizeof buf) <= 0)
        return -1;
    return emu_state_parse(buf);
}

/* Bytes a process holds per device, from its gpu record; returns 1 if it holds a
 * context or memory on any device. */
static inline int emu_read_gpu(int pid, unsigned long long bytes[EMU_MAX_GPUS], int present[EMU_MAX_GPUS])
{
    char path[PATH_MAX], buf[4096];
    memset(bytes, 0, sizeof(unsigned long long) * EMU_MAX_GPUS);
    memset(present, 0, sizeof(int) * EMU_MAX_GPUS);
    emu_pid_path(pid, "gpu", path, sizeof path);
    if (emu_read_file(path, buf, sizeof buf) <= 0)
        return 0;
    int any = 0;
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        int device = -1;
        unsigned long long count = 0;
        if (sscanf(line, "%d %llu", &device, &count) == 2 && device >= 0 && device < EMU_MAX_GPUS) {
            bytes[device] += count;
            present[device] = 1;
            any = 1;
        }
    }
    return any;
}

/* Calls fn(pid, arg) for every live CUDA process in the state directory, in pid order. */
static inline int emu_pid_compare(const void *a, const void *b)
{
    return *(const int *)a - *(const int *)b;
}

static inline void emu_each_process(void (*fn)(int pid, void *arg), void *arg)
{
    DIR *dir = opendir(emu_config_get()->dir);
    if (!dir)
        return;
    int capacity = 64, count = 0;
    int *pids = malloc(sizeof(int) * (size_t)capacity);
    struct dirent *entry;
    while (pids && (entry = readdir(dir)) != NULL) {
        char *end = NULL;
        long pid = strtol(entry->d_name, &end, 10);
        if (end == entry->d_name || *end || pid <= 0)
            continue;
        if (count == capacity) {
            capacity *= 2;
            int *grown = realloc(pids, sizeof(int) * (size_t)capacity);
            if (!grown)
                break;
            pids = grown;
        }
        pids[count++] = (int)pid;
    }
    closedir(dir);
    if (!pids)
        return;
    qsort(pids, (size_t)count, sizeof(int), emu_pid_compare);
    for (int i = 0; i < count; i++)
        if (emu_record(pids[i]) > 0)
            fn(pids[i], arg);
    free(pids);
}

struct emu_usage {
    int exclude;
    unsigned long long bytes[EMU_MAX_GPUS];
};

static inline void emu_add_usage(int pid, void *arg)
{
    struct emu_usage *usage = arg;
    if (pid == usage->exclude)
        return;
    unsigned long long bytes[EMU_MAX_GPUS];
    int present[EMU_MAX_GPUS];
    emu_read_gpu(pid, bytes, present);
    for (int d = 0; d < EMU_MAX_GPUS; d++)
        usage->bytes[d] += bytes[d];
}

/* Device bytes in use by every live CUDA process but `exclude`. */
static inline void emu_device_usage(int exclude, unsigned long long bytes[EMU_MAX_GPUS])
{
    struct emu_usage usage;
    memset(&usage, 0, sizeof usage);
    usage.exclude = exclude;
    emu_each_process(emu_add_usage, &usage);
    memcpy(bytes, usage.bytes, sizeof usage.bytes);
}

/* A stable UUID per device index, in NVML's text form "GPU-xxxxxxxx-xxxx-...". */
static inline void emu_uuid_bytes(int index, unsigned char out[16])
{
    static const unsigned char base[16] = {0x5e, 0x1f, 0x7a, 0x3c, 0x00, 0x00, 0x40, 0x00,
                                           0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    memcpy(out, base, 16);
    out[15] = (unsigned char)index;
}

static inline void emu_uuid_text(int index, char *out, size_t size)
{
    unsigned char b[16];
    emu_uuid_bytes(index, b);
    snprintf(out, size,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
             b[13], b[14], b[15]);
}

static inline int emu_device_for_uuid(const unsigned char uuid[16])
{
    for (int d = 0; d < emu_config_get()->gpus; d++) {
        unsigned char b[16];
        emu_uuid_bytes(d, b);
        if (memcmp(b, uuid, 16) == 0)
            return d;
    }
    return -1;
}

/* Holds the state directory's devices.lock (flock) while memory is reserved. */
static inline int emu_devices_lock(void)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/devices.lock", emu_config_get()->dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0)
        while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {
        }
    return fd;
}

static inline void emu_devices_unlock(int fd)
{
    if (fd >= 0) {
        flock(fd, LOCK_UN);
        close(fd);
    }
}

#endif
