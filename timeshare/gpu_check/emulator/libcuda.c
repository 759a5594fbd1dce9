/*
 * libcuda.so.1 for tests: the slice of the CUDA driver API that timeshare uses, with
 * the checkpoint API (cuCheckpointProcess*) acting across processes the way the real
 * driver does. Loaded by the real cuda-bindings package through LD_LIBRARY_PATH.
 *
 * Sources, cited below where each behaviour is modelled:
 *  [API]    CUDA Driver API, group "CUDA Checkpointing" (6.37 / 13.4 "6.1"),
 *           docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__CHECKPOINT.html, and the
 *           CUcheckpointLockArgs / CUcheckpointRestoreArgs / CUprocessState references.
 *  [README] NVIDIA/cuda-checkpoint README.md ("The Utility", "570 Features").
 *  [CRIU]   checkpoint-restore/criu plugins/cuda/cuda_plugin.c.
 *  [PY]     NVIDIA/cuda-python cuda_bindings/cuda/bindings/_internal/driver_linux.pyx
 *           (how cuda-bindings finds the driver) and cuda.pathfinder.
 *  [ISSUES] NVIDIA/cuda-checkpoint#30, NVIDIA/cuda-checkpoint#41, NVIDIA/cuda-checkpoint#44,
 *           NVIDIA/cuda-checkpoint#47; NVIDIA/nvcf#437; ai-dynamo/snapshot
 *           agent/cmd/cuda-checkpoint-helper; ai-dynamo/dynamo#11304.
 *
 * Concurrent cuCheckpointProcess* calls on DIFFERENT pids from one process.
 *   The [API] documentation states no restriction: each call names one target pid and
 *   the group has no global lock or "one operation at a time" rule. [CRIU] runs one
 *   cuda-checkpoint process per task, sequentially, but that is the plugin's design
 *   (a process-tree walk), not a driver rule. NVIDIA's own pull request ai-dynamo/dynamo#11304
 *   runs the restore and unlock of different pids in parallel and serialises them only
 *   for processes started under one `cuda-checkpoint --launch-job` job file (driver
 *   590+), citing the cuda-checkpoint docs for that exception. The known coupling is
 *   NCCL: NVIDIA/cuda-checkpoint#30 ("when process 1 is in locked/checkpointed state, executing
 *   cuda-checkpoint on process 2 will hang ... known limitation - checkpointing
 *   applications that use NCCL is not supported yet"). So: allowed in general, except
 *   for launch-job peers and NCCL communicators. The emulator allows them: each target
 *   is served by its own restore thread, and a caller holds no global lock, so calls on
 *   different pids overlap (the JSON log shows the overlap). Calls on the SAME pid are
 *   served one at a time by that pid's restore thread, in arrival order.
 *
 * The restore thread. [README]/[CRIU]: the driver needs a thread inside the TARGET
 * process to carry out lock, checkpoint and restore; CRIU therefore locks and
 * checkpoints before freezing, and resumes the restore thread (PTRACE_CONT) around
 * checkpoint and restore (cuda_plugin_checkpoint_devices, resume_device). Here cuInit
 * starts a real pthread in the calling process, named "cuda" + hex digits like the
 * driver's (NVIDIA/nvcf#437), that listens on an abstract unix socket named
 * after the state directory and the pid. A cuCheckpointProcess{Lock,Checkpoint,
 * Restore,Unlock} call in another process sends a request there and waits for the
 * reply, so a SIGSTOPped (frozen) target leaves the caller waiting: the lock gives up
 * at its timeoutMs, the other calls wait until the target runs again (their callers
 * enforce their own timeouts). GetState and GetRestoreThreadId read the target's
 * record and work on a frozen process (CRIU asks for the restore tid of frozen tasks).
 *
 * Fault injection: the control file $TIMESHARE_EMULATOR_DIR/faults, re-read at every
 * call, one rule a line, '#' starts a comment:
 *     <pid|*> <call|*> <effect> [argument]
 *   call:   lock | checkpoint | restore | unlock | get_state | get_restore_tid
 *   effect: fail [code]   the operation fails and the process enters
 *                         CU_PROCESS_STATE_FAILED (terminal); returns code (default 304,
 *                         CUDA_ERROR_OPERATING_SYSTEM, what NVIDIA/cuda-checkpoint#44 saw once a
 *                         restore had gone wrong)
 *           error <code>  returns code, state unchanged (e.g. 2, out of memory; a
 *                         restore's out of memory leaves the process unrestorable, as
 *                         a real one does: see serve_restore)
 *           hang          the call does not return while the rule is in the file; a
 *                         checkpoint or restore shows CHECKPOINTING / RESTORING meanwhile
 *                         (with an emulated CUDA 13.0+ driver; see reported())
 *           delay <ms>    the operation takes ms longer (in-progress state visible)
 *   Rules for lock/checkpoint/restore/unlock are applied by the target's restore
 *   thread; rules for get_state/get_restore_tid by the caller.
 */
#include "emulator.h"

#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef struct emu_ctx *CUcontext;
typedef int CUprocessState;
typedef struct {
    char bytes[16];
} CUuuid;

/* [API] structure references (CUDA 12.8 cuda.h layout; 13.x keeps these offsets). */
typedef struct {
    unsigned int timeoutMs; /* "0 indicates no timeout" */
    unsigned int reserved0; /* "must be zero" */
    cuuint64_t reserved1[7];
} CUcheckpointLockArgs;
typedef struct {
    cuuint64_t reserved[8];
} CUcheckpointCheckpointArgs;
typedef struct {
    cuuint64_t reserved[8];
} CUcheckpointUnlockArgs;
typedef struct {
    CUuuid oldUuid;
    CUuuid newUuid;
} CUcheckpointGpuPair;
typedef struct {
    CUcheckpointGpuPair *gpuPairs;
    unsigned int gpuPairsCount;
} CUcheckpointRestoreArgs;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_OPERATING_SYSTEM = 304,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_TIMEOUT = 909,
    CUDA_ERROR_UNKNOWN = 999,
};

/* ------------------------------------------------------------------ errors */

static const struct {
    int code;
    const char *name;
    const char *text;
} ERRORS[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed or operation not supported on this OS"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {909, "CUDA_ERROR_TIMEOUT", "wait operation timed out"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++)
        if (ERRORS[i].code == error) {
            if (pStr)
                *pStr = ERRORS[i].name;
            return CUDA_SUCCESS;
        }
    if (pStr)
        *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    for (size_t i = 0; i < sizeof ERRORS / sizeof ERRORS[0]; i++)
        if (ERRORS[i].code == error) {
            if (pStr)
                *pStr = ERRORS[i].text;
            return CUDA_SUCCESS;
        }
    if (pStr)
        *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

#define BEGIN(name) emu_log(name, (int)getpid(), "begin", 0, 0)
#define RETURN(name, result)                                                                       \
    do {                                                                                           \
        CUresult result_ = (result);                                                               \
        emu_log(name, (int)getpid(), "end", 1, result_);                                           \
        return result_;                                                                            \
    } while (0)

/* ------------------------------------------------------------------ process state */

struct emu_ctx {
    unsigned magic;
    int device;
    int primary;
    int refs; /* primary context: retain count; others: 1 while alive */
    int alive;
};
#define CTX_MAGIC 0xC0DAC7A1u

struct emu_alloc {
    CUdeviceptr ptr; /* the host mapping that stands in for device memory */
    size_t size;
    int device;
    struct emu_ctx *ctx;
    struct emu_alloc *next;
};

static pthread_once_t g_init_once = PTHREAD_ONCE_INIT;
static CUresult g_init_result = CUDA_ERROR_NOT_INITIALIZED;
static int g_initialized; /* cuInit succeeded in this process image */
static int g_forked;      /* this is a child forked after cuInit: CUDA is unusable */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv; /* CLOCK_MONOTONIC */
static int g_state = EMU_RUNNING;
static int g_locking;  /* a lock is waiting for in-flight calls: new calls block */
static int g_inflight; /* API calls between api_enter and api_leave */
static int g_resident = 1; /* 0 while checkpointed: GPU resources released */
static int g_unrestorable; /* a restore ran out of device memory: see serve_restore */

static pthread_mutex_t g_mem_mu = PTHREAD_MUTEX_INITIALIZER;
static struct emu_alloc *g_allocs;
static struct emu_ctx *g_primary[EMU_MAX_GPUS];
static int g_contexts[EMU_MAX_GPUS]; /* live contexts per device */

static int g_listen_fd = -1;
static int g_restore_tid;
static pthread_mutex_t g_tid_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_tid_cv = PTHREAD_COND_INITIALIZER;

static __thread struct emu_ctx *t_stack[32];
static __thread int t_depth;

static struct emu_ctx *current_ctx(void)
{
    return t_depth ? t_stack[t_depth - 1] : NULL;
}

static int valid_ctx(struct emu_ctx *ctx)
{
    return ctx && ctx->magic == CTX_MAGIC && ctx->alive;
}

static int valid_device(CUdevice dev)
{
    return dev >= 0 && dev < emu_config_get()->gpus;
}

static int reported(int state);

static void publish_state(int state)
{
    char path[PATH_MAX], text[32];
    state = reported(state);
    emu_pid_path((int)getpid(), "state", path, sizeof path);
    snprintf(text, sizeof text, "%s\n", emu_state_name(state));
    emu_write_atomic(path, text);
}

/* Caller holds g_mem_mu. Writes the gpu record NVML reads: one line per device with a
 * context or memory, nothing while checkpointed ([README]: "all of CUDA's GPU
 * resources are released"). */
static void publish_gpu_locked(void)
{
    unsigned long long bytes[EMU_MAX_GPUS] = {0};
    for (struct emu_alloc *a = g_allocs; a; a = a->next)
        bytes[a->device] += a->size;
    char text[EMU_MAX_GPUS * 48] = "";
    size_t used = 0;
    if (g_resident)
        for (int d = 0; d < EMU_MAX_GPUS; d++)
            if (g_contexts[d] > 0 || bytes[d] > 0)
                used += (size_t)snprintf(text + used, sizeof text - used, "%d %llu\n", d, bytes[d]);
    char path[PATH_MAX];
    emu_pid_path((int)getpid(), "gpu", path, sizeof path);
    emu_write_atomic(path, text);
}

static void own_bytes_locked(unsigned long long bytes[EMU_MAX_GPUS])
{
    memset(bytes, 0, sizeof(unsigned long long) * EMU_MAX_GPUS);
    for (struct emu_alloc *a = g_allocs; a; a = a->next)
        bytes[a->device] += a->size;
}

/* [README] "any CUDA driver APIs which launch work, manage resources, or otherwise
 * impact GPU state are locked" and "calling runtime or driver APIs (which may block
 * until CUDA is resumed)"; [API] lock "will block further CUDA API calls". Calls that
 * touch the GPU wait here while the process is anything but RUNNING. */
static CUresult api_enter(void)
{
    if (g_forked || !g_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&g_mu);
    while (g_locking || (g_state != EMU_RUNNING && g_state != EMU_FAILED))
        pthread_cond_wait(&g_cv, &g_mu);
    if (g_state == EMU_FAILED) {
        /* No documented behaviour: CUDA is unusable in a process whose checkpoint or
         * restore failed ("uncorrectable error"), so its calls fail. */
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    g_inflight++;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

static void api_leave(void)
{
    pthread_mutex_lock(&g_mu);
    if (--g_inflight == 0)
        pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static CUresult need_init(void)
{
    return g_forked || !g_initialized ? CUDA_ERROR_NOT_INITIALIZED : CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ faults */

enum { FAULT_NONE, FAULT_FAIL, FAULT_ERROR, FAULT_HANG, FAULT_DELAY };

static int find_fault(int pid, const char *call, int *argument)
{
    char path[PATH_MAX], buf[8192];
    snprintf(path, sizeof path, "%s/faults", emu_config_get()->dir);
    if (emu_read_file(path, buf, sizeof buf) <= 0)
        return FAULT_NONE;
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char who[32] = "", what[64] = "", effect[32] = "";
        int value = 0;
        int fields = sscanf(line, "%31s %63s %31s %d", who, what, effect, &value);
        if (fields < 3)
            continue;
        if (strcmp(who, "*") != 0 && atoi(who) != pid)
            continue;
        if (strcmp(what, "*") != 0 && strcmp(what, call) != 0)
            continue;
        if (strcmp(effect, "fail") == 0) {
            *argument = fields == 4 ? value : CUDA_ERROR_OPERATING_SYSTEM;
            return FAULT_FAIL;
        }
        if (strcmp(effect, "error") == 0) {
            *argument = fields == 4 ? value : CUDA_ERROR_UNKNOWN;
            return FAULT_ERROR;
        }
        if (strcmp(effect, "hang") == 0)
            return FAULT_HANG;
        if (strcmp(effect, "delay") == 0) {
            *argument = value;
            return FAULT_DELAY;
        }
    }
    return FAULT_NONE;
}

/* Applies hang and delay rules; returns the fail/error rule left to apply, if any. */
static int apply_fault(int pid, const char *call, int *argument)
{
    int fault = find_fault(pid, call, argument);
    while (fault == FAULT_HANG) {
        emu_sleep_ms(10);
        fault = find_fault(pid, call, argument);
    }
    if (fault == FAULT_DELAY) {
        emu_sleep_ms(*argument);
        return FAULT_NONE;
    }
    return fault;
}

/* ------------------------------------------------------------------ restore thread */

static int socket_address(int pid, struct sockaddr_un *address, socklen_t *length)
{
    struct stat st;
    if (stat(emu_config_get()->dir, &st) != 0)
        return -1;
    memset(address, 0, sizeof *address);
    address->sun_family = AF_UNIX;
    /* abstract namespace (unix(7)): no path length limit, gone when the process dies */
    int n = snprintf(address->sun_path + 1, sizeof address->sun_path - 1,
                     "timeshare-emulator/%llx:%llx/%d", (unsigned long long)st.st_dev,
                     (unsigned long long)st.st_ino, pid);
    *length = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
    return 0;
}

static void copy_time(void)
{
    unsigned long long rate = emu_config_get()->copy_bytes_per_second;
    if (!rate)
        return;
    unsigned long long total = 0;
    pthread_mutex_lock(&g_mem_mu);
    for (struct emu_alloc *a = g_allocs; a; a = a->next)
        total += a->size;
    pthread_mutex_unlock(&g_mem_mu);
    emu_sleep_ms((long)(total * 1000ULL / rate));
}

/* CU_PROCESS_STATE_CHECKPOINTING / RESTORING exist from CUDA 13.0 (cuda.h 13.x and
 * cuda-bindings 13.x's CUprocessState; 12.x bindings reject 4 and 5 with ValueError).
 * An emulated 12.x driver keeps reporting the state the operation started from. */
static int reported(int state)
{
    if (emu_config_get()->cuda_version >= 13000)
        return state;
    return state == EMU_CHECKPOINTING ? EMU_LOCKED
           : state == EMU_RESTORING   ? EMU_CHECKPOINTED
                                      : state;
}

static void set_state_locked(int state)
{
    g_state = state;
    publish_state(state);
    pthread_cond_broadcast(&g_cv);
}

static void set_state(int state)
{
    pthread_mutex_lock(&g_mu);
    set_state_locked(state);
    pthread_mutex_unlock(&g_mu);
}

static int get_state(void)
{
    pthread_mutex_lock(&g_mu);
    int state = g_state;
    pthread_mutex_unlock(&g_mu);
    return state;
}

/* [API] cuCheckpointProcessLock: "Process must be in the RUNNING state in order to
 * lock"; "If timeoutMs is specified and the timeout is reached the process will be
 * left in the RUNNING state". [README]: already-submitted work completes first. */
static CUresult serve_lock(long long deadline)
{
    int argument = 0, pid = (int)getpid();
    int fault = apply_fault(pid, "lock", &argument);
    if (deadline && emu_now_ns() >= deadline)
        return emu_config_get()->lock_timeout_result; /* the caller has given up */
    pthread_mutex_lock(&g_mu);
    if (g_state != EMU_RUNNING) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    if (fault == FAULT_ERROR) {
        pthread_mutex_unlock(&g_mu);
        return argument;
    }
    if (fault == FAULT_FAIL) {
        set_state_locked(EMU_FAILED);
        pthread_mutex_unlock(&g_mu);
        return argument;
    }
    g_locking = 1;
    while (g_inflight > 0) {
        if (!deadline) {
            pthread_cond_wait(&g_cv, &g_mu);
            continue;
        }
        struct timespec until = {deadline / 1000000000LL, deadline % 1000000000LL};
        if (pthread_cond_timedwait(&g_cv, &g_mu, &until) == ETIMEDOUT && g_inflight > 0) {
            g_locking = 0;
            pthread_cond_broadcast(&g_cv);
            pthread_mutex_unlock(&g_mu);
            return emu_config_get()->lock_timeout_result;
        }
    }
    g_locking = 0;
    set_state_locked(EMU_LOCKED);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

/* [API] cuCheckpointProcessCheckpoint: "The process must be in the
 * CU_PROCESS_STATE_LOCKED state"; "Underlying GPU references are released when
 * checkpointing completes"; CU_PROCESS_STATE_CHECKPOINTING while "being checkpointed". */
static CUresult serve_checkpoint(void)
{
    int argument = 0, pid = (int)getpid();
    if (get_state() != EMU_LOCKED)
        return CUDA_ERROR_ILLEGAL_STATE;
    set_state(EMU_CHECKPOINTING);
    int fault = apply_fault(pid, "checkpoint", &argument);
    if (fault == FAULT_FAIL) {
        set_state(EMU_FAILED);
        return argument;
    }
    if (fault == FAULT_ERROR) {
        set_state(EMU_LOCKED);
        return argument;
    }
    copy_time(); /* [README] "device memory is copied to the host" */
    pthread_mutex_lock(&g_mem_mu);
    g_resident = 0;
    publish_gpu_locked();
    pthread_mutex_unlock(&g_mem_mu);
    set_state(EMU_CHECKPOINTED);
    return CUDA_SUCCESS;
}

/* [API] cuCheckpointProcessRestore: "Process must be in the CU_PROCESS_STATE_CHECKPOINTED
 * state"; "The GPU to restore onto needs to have enough memory"; "If an array of GPU
 * UUID pairs is specified, it must contain every checkpointed GPU"; leaves LOCKED.
 * NVIDIA/cuda-checkpoint#44 (driver 580.95.05, CUDA 13.0): a restore that runs out of
 * memory returns CUDA_ERROR_OUT_OF_MEMORY and the state stays CHECKPOINTED; from then on
 * every restore returns CUDA_ERROR_OPERATING_SYSTEM, even once the memory is free, and unlock
 * CUDA_ERROR_ILLEGAL_STATE: the process can only be killed. Modelled for every emulated
 * driver (none is known to behave otherwise). docs/facts.md has no reading of a restore
 * on a full device yet. */
static CUresult serve_restore(const char *mapping)
{
    int argument = 0, pid = (int)getpid();
    int map[EMU_MAX_GPUS], mapped[EMU_MAX_GPUS] = {0};
    for (int d = 0; d < EMU_MAX_GPUS; d++)
        map[d] = d;
    if (get_state() != EMU_CHECKPOINTED)
        return CUDA_ERROR_ILLEGAL_STATE;
    if (g_unrestorable)
        return CUDA_ERROR_OPERATING_SYSTEM;
    if (mapping && strcmp(mapping, "-") != 0) {
        char copy[512];
        snprintf(copy, sizeof copy, "%s", mapping);
        char *save = NULL;
        for (char *pair = strtok_r(copy, ",", &save); pair; pair = strtok_r(NULL, ",", &save)) {
            int from = -1, to = -1;
            if (sscanf(pair, "%d:%d", &from, &to) != 2 || !valid_device(from) || !valid_device(to))
                return CUDA_ERROR_INVALID_VALUE;
            map[from] = to;
            mapped[from] = 1;
        }
        pthread_mutex_lock(&g_mem_mu);
        for (int d = 0; d < EMU_MAX_GPUS; d++) {
            int used = g_contexts[d] > 0;
            for (struct emu_alloc *a = g_allocs; a; a = a->next)
                used |= a->device == d;
            if (used && !mapped[d]) {
                pthread_mutex_unlock(&g_mem_mu);
                return CUDA_ERROR_INVALID_VALUE;
            }
        }
        pthread_mutex_unlock(&g_mem_mu);
    }
    set_state(EMU_RESTORING);
    int fault = apply_fault(pid, "restore", &argument);
    if (fault == FAULT_FAIL) {
        set_state(EMU_FAILED);
        return argument;
    }
    if (fault == FAULT_ERROR) {
        g_unrestorable = argument == CUDA_ERROR_OUT_OF_MEMORY; /* NVIDIA/cuda-checkpoint#44 */
        set_state(EMU_CHECKPOINTED);
        return argument;
    }
    /* [README] restore: "GPUs are re-acquired by the process" first, then "device
     * memory is copied back" */
    int lock_fd = emu_devices_lock();
    unsigned long long others[EMU_MAX_GPUS], ours[EMU_MAX_GPUS] = {0};
    emu_device_usage(pid, others);
    pthread_mutex_lock(&g_mem_mu);
    for (struct emu_alloc *a = g_allocs; a; a = a->next)
        ours[map[a->device]] += a->size;
    emu_config *c = emu_config_get();
    for (int d = 0; d < c->gpus; d++)
        if (ours[d] && others[d] + ours[d] + c->reserved_bytes > c->gpu_memory) {
            pthread_mutex_unlock(&g_mem_mu);
            emu_devices_unlock(lock_fd);
            g_unrestorable = 1; /* NVIDIA/cuda-checkpoint#44 */
            set_state(EMU_CHECKPOINTED);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    int contexts[EMU_MAX_GPUS] = {0};
    struct emu_ctx *primary[EMU_MAX_GPUS] = {0};
    for (int d = 0; d < EMU_MAX_GPUS; d++) {
        contexts[map[d]] += g_contexts[d];
        if (g_primary[d])
            primary[map[d]] = g_primary[d];
        if (g_primary[d])
            g_primary[d]->device = map[d];
    }
    memcpy(g_contexts, contexts, sizeof contexts);
    memcpy(g_primary, primary, sizeof primary);
    for (struct emu_alloc *a = g_allocs; a; a = a->next)
        a->device = map[a->device];
    g_resident = 1;
    publish_gpu_locked();
    pthread_mutex_unlock(&g_mem_mu);
    emu_devices_unlock(lock_fd);
    copy_time();
    set_state(EMU_LOCKED);
    return CUDA_SUCCESS;
}

/* [API] cuCheckpointProcessUnlock: "Process must be in the LOCKED state"; then
 * RUNNING and the blocked calls proceed. */
static CUresult serve_unlock(void)
{
    int argument = 0, pid = (int)getpid();
    if (get_state() != EMU_LOCKED)
        return CUDA_ERROR_ILLEGAL_STATE;
    int fault = apply_fault(pid, "unlock", &argument);
    if (fault == FAULT_FAIL) {
        set_state(EMU_FAILED);
        return argument;
    }
    if (fault == FAULT_ERROR)
        return argument;
    pthread_mutex_lock(&g_mu);
    if (g_state != EMU_LOCKED) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    set_state_locked(EMU_RUNNING);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

static int read_line(int fd, char *buf, size_t size)
{
    size_t used = 0;
    while (used + 1 < size) {
        ssize_t n = recv(fd, buf + used, 1, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        if (buf[used] == '\n') {
            buf[used] = '\0';
            return (int)used;
        }
        used++;
    }
    return -1;
}

static void serve(int fd)
{
    char request[640], op[32] = "", mapping[512] = "-";
    long long deadline = 0;
    int caller = 0;
    struct timeval limit = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
    if (read_line(fd, request, sizeof request) < 0)
        return;
    if (sscanf(request, "%31s %lld %d %511s", op, &deadline, &caller, mapping) < 3)
        return;
    char call[64];
    snprintf(call, sizeof call, "restoreThread.%s", op);
    emu_log(call, (int)getpid(), "begin", 0, 0);
    CUresult result = CUDA_ERROR_INVALID_VALUE;
    if (strcmp(op, "lock") == 0)
        result = serve_lock(deadline);
    else if (strcmp(op, "checkpoint") == 0)
        result = serve_checkpoint();
    else if (strcmp(op, "restore") == 0)
        result = serve_restore(mapping);
    else if (strcmp(op, "unlock") == 0)
        result = serve_unlock();
    /* Only a lock's result can still change with its reply (below); any other
     * is logged before the reply, since the caller may stop this process
     * (SIGSTOP) as soon as it has it, before a log written after would land. */
    int lock_awaits_reply = strcmp(op, "lock") == 0 && result == CUDA_SUCCESS && deadline;
    if (!lock_awaits_reply)
        emu_log(call, (int)getpid(), "end", 1, result);
    char reply[32];
    int n = snprintf(reply, sizeof reply, "%d\n", result);
    if (send(fd, reply, (size_t)n, MSG_NOSIGNAL) != n && lock_awaits_reply) {
        /* The caller's timeout expired first and it has closed its end (it shuts down
         * reading before it gives up, so this send fails rather than being lost): it
         * reports the timeout, so the process must be left RUNNING. */
        pthread_mutex_lock(&g_mu);
        if (g_state == EMU_LOCKED)
            set_state_locked(EMU_RUNNING);
        pthread_mutex_unlock(&g_mu);
        result = emu_config_get()->lock_timeout_result;
    }
    if (lock_awaits_reply)
        emu_log(call, (int)getpid(), "end", 1, result);
}

static void *restore_thread(void *unused)
{
    (void)unused;
    char name[16];
    /* NVIDIA/nvcf#437: the driver's restore thread's comm is "cuda" followed by
     * hex digits. */
    snprintf(name, sizeof name, "cuda%08x", (unsigned)getpid() * 2654435761u);
    pthread_setname_np(pthread_self(), name);
    pthread_mutex_lock(&g_tid_mu);
    g_restore_tid = (int)gettid();
    pthread_cond_broadcast(&g_tid_cv);
    pthread_mutex_unlock(&g_tid_mu);
    for (;;) {
        int fd = accept4(g_listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return NULL;
        }
        serve(fd);
        close(fd);
    }
}

static void atfork_child(void)
{
    /* A forked child has no restore thread and no GPU state of its own. */
    g_forked = 1;
    g_initialized = 0;
    if (g_listen_fd >= 0)
        close(g_listen_fd);
    g_listen_fd = -1;
}

static void do_init(void)
{
    emu_config *c = emu_config_get();
    if (c->gpus == 0) {
        g_init_result = CUDA_ERROR_NO_DEVICE;
        return;
    }
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&g_cv, &attr);
    pthread_condattr_destroy(&attr);

    char path[PATH_MAX];
    mkdir(c->dir, 0755);
    snprintf(path, sizeof path, "%s/%d", c->dir, (int)getpid());
    mkdir(path, 0755);

    struct sockaddr_un address;
    socklen_t length;
    g_listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (g_listen_fd < 0 || socket_address((int)getpid(), &address, &length) != 0 ||
        bind(g_listen_fd, (struct sockaddr *)&address, length) != 0 || listen(g_listen_fd, 64) != 0) {
        g_init_result = CUDA_ERROR_OPERATING_SYSTEM;
        return;
    }

    /* The thread starts with every signal blocked: signals stay with the app's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t thread;
    pthread_attr_t thread_attr;
    pthread_attr_init(&thread_attr);
    pthread_attr_setdetachstate(&thread_attr, PTHREAD_CREATE_DETACHED);
    int failed = pthread_create(&thread, &thread_attr, restore_thread, NULL);
    pthread_attr_destroy(&thread_attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (failed) {
        g_init_result = CUDA_ERROR_OPERATING_SYSTEM;
        return;
    }
    pthread_mutex_lock(&g_tid_mu);
    while (!g_restore_tid)
        pthread_cond_wait(&g_tid_cv, &g_tid_mu);
    pthread_mutex_unlock(&g_tid_mu);

    publish_state(EMU_RUNNING);
    pthread_mutex_lock(&g_mem_mu);
    publish_gpu_locked();
    pthread_mutex_unlock(&g_mem_mu);
    char record[64];
    snprintf(record, sizeof record, "%d %llu\n", g_restore_tid, emu_start_time((int)getpid()));
    emu_pid_path((int)getpid(), "process", path, sizeof path);
    emu_write_atomic(path, record);
    pthread_atfork(NULL, NULL, atfork_child);
    g_initialized = 1;
    g_init_result = CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ init, version */

EXPORT CUresult cuInit(unsigned int flags)
{
    BEGIN("cuInit");
    if (g_forked)
        RETURN("cuInit", CUDA_ERROR_NOT_INITIALIZED);
    if (flags != 0)
        RETURN("cuInit", CUDA_ERROR_INVALID_VALUE);
    pthread_once(&g_init_once, do_init);
    RETURN("cuInit", g_init_result);
}

EXPORT CUresult cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = emu_config_get()->cuda_version;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ devices */

EXPORT CUresult cuDeviceGetCount(int *count)
{
    BEGIN("cuDeviceGetCount");
    CUresult r = need_init();
    if (r == CUDA_SUCCESS && !count)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *count = emu_config_get()->gpus;
    RETURN("cuDeviceGetCount", r);
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    BEGIN("cuDeviceGet");
    CUresult r = need_init();
    if (r == CUDA_SUCCESS && !device)
        r = CUDA_ERROR_INVALID_VALUE;
    else if (r == CUDA_SUCCESS && !valid_device(ordinal))
        r = CUDA_ERROR_INVALID_DEVICE;
    if (r == CUDA_SUCCESS)
        *device = ordinal;
    RETURN("cuDeviceGet", r);
}

EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    BEGIN("cuDeviceGetName");
    CUresult r = need_init();
    if (r == CUDA_SUCCESS && (!name || len <= 0))
        r = CUDA_ERROR_INVALID_VALUE;
    else if (r == CUDA_SUCCESS && !valid_device(dev))
        r = CUDA_ERROR_INVALID_DEVICE;
    if (r == CUDA_SUCCESS)
        snprintf(name, (size_t)len, "%s", emu_config_get()->gpu_name);
    RETURN("cuDeviceGetName", r);
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    BEGIN("cuDeviceGetUuid");
    CUresult r = need_init();
    if (r == CUDA_SUCCESS && !uuid)
        r = CUDA_ERROR_INVALID_VALUE;
    else if (r == CUDA_SUCCESS && !valid_device(dev))
        r = CUDA_ERROR_INVALID_DEVICE;
    if (r == CUDA_SUCCESS)
        emu_uuid_bytes(dev, (unsigned char *)uuid->bytes);
    RETURN("cuDeviceGetUuid", r);
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid(uuid, dev);
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    BEGIN("cuDeviceTotalMem");
    CUresult r = need_init();
    if (r == CUDA_SUCCESS && !bytes)
        r = CUDA_ERROR_INVALID_VALUE;
    else if (r == CUDA_SUCCESS && !valid_device(dev))
        r = CUDA_ERROR_INVALID_DEVICE;
    if (r == CUDA_SUCCESS)
        *bytes = (size_t)emu_config_get()->gpu_memory;
    RETURN("cuDeviceTotalMem", r);
}

EXPORT CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev)
{
    BEGIN("cuDeviceGetAttribute");
    CUresult r = need_init();
    if (r == CUDA_SUCCESS && !pi)
        r = CUDA_ERROR_INVALID_VALUE;
    else if (r == CUDA_SUCCESS && !valid_device(dev))
        r = CUDA_ERROR_INVALID_DEVICE;
    if (r == CUDA_SUCCESS) {
        switch (attrib) { /* CUdevice_attribute values from cuda.h */
        case 16: *pi = 132; break;        /* MULTIPROCESSOR_COUNT */
        case 33: *pi = 0x18 + dev; break; /* PCI_BUS_ID */
        case 34: *pi = 0; break;          /* PCI_DEVICE_ID */
        case 41: *pi = 1; break;          /* UNIFIED_ADDRESSING */
        case 50: *pi = 0; break;          /* PCI_DOMAIN_ID */
        case 75: *pi = 9; break;          /* COMPUTE_CAPABILITY_MAJOR */
        case 76: *pi = 0; break;          /* COMPUTE_CAPABILITY_MINOR */
        default: r = CUDA_ERROR_INVALID_VALUE;
        }
    }
    RETURN("cuDeviceGetAttribute", r);
}

/* ------------------------------------------------------------------ contexts */

static struct emu_ctx *new_ctx(int device, int primary)
{
    struct emu_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return NULL;
    ctx->magic = CTX_MAGIC;
    ctx->device = device;
    ctx->primary = primary;
    ctx->alive = 1;
    return ctx;
}

/* Caller holds g_mem_mu: frees every allocation made in ctx. */
static void free_ctx_allocs_locked(struct emu_ctx *ctx)
{
    struct emu_alloc **link = &g_allocs;
    while (*link) {
        struct emu_alloc *a = *link;
        if (a->ctx == ctx) {
            *link = a->next;
            munmap((void *)(uintptr_t)a->ptr, a->size);
            free(a);
        } else {
            link = &a->next;
        }
    }
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    BEGIN("cuDevicePrimaryCtxRetain");
    CUresult r = api_enter();
    if (r != CUDA_SUCCESS)
        RETURN("cuDevicePrimaryCtxRetain", r);
    if (!pctx)
        r = CUDA_ERROR_INVALID_VALUE;
    else if (!valid_device(dev))
        r = CUDA_ERROR_INVALID_DEVICE;
    else {
        pthread_mutex_lock(&g_mem_mu);
        if (!g_primary[dev])
            g_primary[dev] = new_ctx(dev, 1);
        struct emu_ctx *ctx = g_primary[dev];
        if (!ctx) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            if (ctx->refs++ == 0) {
                ctx->alive = 1;
                g_contexts[dev]++;
                publish_gpu_locked();
            }
            *pctx = ctx;
        }
        pthread_mutex_unlock(&g_mem_mu);
    }
    api_leave();
    RETURN("cuDevicePrimaryCtxRetain", r);
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    BEGIN("cuDevicePrimaryCtxRelease");
    CUresult r = api_enter();
    if (r != CUDA_SUCCESS)
        RETURN("cuDevicePrimaryCtxRelease", r);
    if (!valid_device(dev)) {
        r = CUDA_ERROR_INVALID_DEVICE;
    } else {
        pthread_mutex_lock(&g_mem_mu);
        struct emu_ctx *ctx = g_primary[dev];
        if (!ctx || ctx->refs == 0) {
            r = CUDA_ERROR_INVALID_CONTEXT;
        } else if (--ctx->refs == 0) {
            free_ctx_allocs_locked(ctx);
            g_contexts[dev]--;
            publish_gpu_locked();
        }
        pthread_mutex_unlock(&g_mem_mu);
    }
    api_leave();
    RETURN("cuDevicePrimaryCtxRelease", r);
}

EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    BEGIN("cuDevicePrimaryCtxReset");
    CUresult r = api_enter();
    if (r != CUDA_SUCCESS)
        RETURN("cuDevicePrimaryCtxReset", r);
    if (!valid_device(dev)) {
        r = CUDA_ERROR_INVALID_DEVICE;
    } else {
        pthread_mutex_lock(&g_mem_mu);
        struct emu_ctx *ctx = g_primary[dev];
        if (ctx)
            free_ctx_allocs_locked(ctx);
        publish_gpu_locked();
        pthread_mutex_unlock(&g_mem_mu);
    }
    api_leave();
    RETURN("cuDevicePrimaryCtxReset", r);
}

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    BEGIN("cuDevicePrimaryCtxGetState");
    CUresult r = need_init();
    if (r == CUDA_SUCCESS && (!flags || !active))
        r = CUDA_ERROR_INVALID_VALUE;
    else if (r == CUDA_SUCCESS && !valid_device(dev))
        r = CUDA_ERROR_INVALID_DEVICE;
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_mem_mu);
        *flags = 0;
        *active = g_primary[dev] && g_primary[dev]->refs > 0;
        pthread_mutex_unlock(&g_mem_mu);
    }
    RETURN("cuDevicePrimaryCtxGetState", r);
}

static CUresult create_ctx(const char *name, CUcontext *pctx, CUdevice dev)
{
    BEGIN(name);
    CUresult r = api_enter();
    if (r != CUDA_SUCCESS)
        RETURN(name, r);
    if (!pctx)
        r = CUDA_ERROR_INVALID_VALUE;
    else if (!valid_device(dev))
        r = CUDA_ERROR_INVALID_DEVICE;
    else if (t_depth >= (int)(sizeof t_stack / sizeof t_stack[0]))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    else {
        struct emu_ctx *ctx = new_ctx(dev, 0);
        if (!ctx) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            ctx->refs = 1;
            pthread_mutex_lock(&g_mem_mu);
            g_contexts[dev]++;
            publish_gpu_locked();
            pthread_mutex_unlock(&g_mem_mu);
            t_stack[t_depth++] = ctx; /* a new context becomes current */
            *pctx = ctx;
        }
    }
    api_leave();
    RETURN(name, r);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    return create_ctx("cuCtxCreate", pctx, dev);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, void *paramsArray, int numParams,
                               unsigned int flags, CUdevice dev)
{
    (void)paramsArray;
    (void)numParams;
    (void)flags;
    return create_ctx("cuCtxCreate", pctx, dev);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, void *ctxCreateParams, unsigned int flags,
                               CUdevice dev)
{
    (void)ctxCreateParams;
    (void)flags;
    return create_ctx("cuCtxCreate", pctx, dev);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    BEGIN("cuCtxDestroy");
    CUresult r = api_enter();
    if (r != CUDA_SUCCESS)
        RETURN("cuCtxDestroy", r);
    if (!valid_ctx(ctx) || ctx->primary) {
        r = CUDA_ERROR_INVALID_CONTEXT;
    } else {
        pthread_mutex_lock(&g_mem_mu);
        free_ctx_allocs_locked(ctx);
        g_contexts[ctx->device]--;
        ctx->alive = 0; /* the handle stays allocated so stale uses are caught */
        publish_gpu_locked();
        pthread_mutex_unlock(&g_mem_mu);
        for (int i = 0; i < t_depth; i++)
            if (t_stack[i] == ctx) {
                memmove(&t_stack[i], &t_stack[i + 1], sizeof t_stack[0] * (size_t)(t_depth - i - 1));
                t_depth--;
                i--;
            }
    }
    api_leave();
    RETURN("cuCtxDestroy", r);
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    BEGIN("cuCtxSetCurrent");
    CUresult r = need_init();
    if (r == CUDA_SUCCESS && ctx && !valid_ctx(ctx))
        r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS) {
        if (!ctx) {
            if (t_depth)
                t_depth--;
        } else if (t_depth) {
            t_stack[t_depth - 1] = ctx;
        } else {
            t_stack[t_depth++] = ctx;
        }
    }
    RETURN("cuCtxSetCurrent", r);
}

EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    BEGIN("cuCtxGetCurrent");
    CUresult r = need_init();
    if (r == CUDA_SUCCESS && !pctx)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *pctx = current_ctx();
    RETURN("cuCtxGetCurrent", r);
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    BEGIN("cuCtxPushCurrent");
    CUresult r = need_init();
    if (r == CUDA_SUCCESS && !valid_ctx(ctx))
        r = CUDA_ERROR_INVALID_CONTEXT;
    else if (r == CUDA_SUCCESS && t_depth >= (int)(sizeof t_stack / sizeof t_stack[0]))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS)
        t_stack[t_depth++] = ctx;
    RETURN("cuCtxPushCurrent", r);
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    BEGIN("cuCtxPopCurrent");
    CUresult r = need_init();
    if (r == CUDA_SUCCESS && !t_depth)
        r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS) {
        struct emu_ctx *ctx = t_stack[--t_depth];
        if (pctx)
            *pctx = ctx;
    }
    RETURN("cuCtxPopCurrent", r);
}

EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
    BEGIN("cuCtxGetDevice");
    CUresult r = need_init();
    struct emu_ctx *ctx = current_ctx();
    if (r == CUDA_SUCCESS && !device)
        r = CUDA_ERROR_INVALID_VALUE;
    else if (r == CUDA_SUCCESS && !valid_ctx(ctx))
        r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS)
        *device = ctx->device;
    RETURN("cuCtxGetDevice", r);
}

static CUresult synchronize(const char *name, struct emu_ctx *ctx)
{
    BEGIN(name);
    CUresult r = api_enter();
    if (r != CUDA_SUCCESS)
        RETURN(name, r);
    if (!valid_ctx(ctx))
        r = CUDA_ERROR_INVALID_CONTEXT;
    api_leave();
    RETURN(name, r);
}

EXPORT CUresult cuCtxSynchronize(void)
{
    return synchronize("cuCtxSynchronize", current_ctx());
}

EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    return synchronize("cuCtxSynchronize", ctx ? ctx : current_ctx());
}

/* ------------------------------------------------------------------ memory */

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    BEGIN("cuMemGetInfo");
    CUresult r = api_enter();
    if (r != CUDA_SUCCESS)
        RETURN("cuMemGetInfo", r);
    struct emu_ctx *ctx = current_ctx();
    if (!free_bytes || !total_bytes)
        r = CUDA_ERROR_INVALID_VALUE;
    else if (!valid_ctx(ctx))
        r = CUDA_ERROR_INVALID_CONTEXT;
    else {
        emu_config *c = emu_config_get();
        unsigned long long others[EMU_MAX_GPUS], ours[EMU_MAX_GPUS];
        emu_device_usage((int)getpid(), others);
        pthread_mutex_lock(&g_mem_mu);
        own_bytes_locked(ours);
        pthread_mutex_unlock(&g_mem_mu);
        unsigned long long used = others[ctx->device] + ours[ctx->device] + c->reserved_bytes;
        *total_bytes = (size_t)c->gpu_memory;
        *free_bytes = used >= c->gpu_memory ? 0 : (size_t)(c->gpu_memory - used);
    }
    api_leave();
    RETURN("cuMemGetInfo", r);
}

/* Device memory is a lazily committed host mapping (MAP_NORESERVE), so a test can
 * "allocate" gigabytes; its contents survive checkpoint and restore as on a GPU. */
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    BEGIN("cuMemAlloc");
    CUresult r = api_enter();
    if (r != CUDA_SUCCESS)
        RETURN("cuMemAlloc", r);
    struct emu_ctx *ctx = current_ctx();
    if (!dptr || bytesize == 0) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (!valid_ctx(ctx)) {
        r = CUDA_ERROR_INVALID_CONTEXT;
    } else {
        emu_config *c = emu_config_get();
        int lock_fd = emu_devices_lock();
        unsigned long long others[EMU_MAX_GPUS], ours[EMU_MAX_GPUS];
        emu_device_usage((int)getpid(), others);
        pthread_mutex_lock(&g_mem_mu);
        own_bytes_locked(ours);
        int d = ctx->device;
        if (others[d] + ours[d] + bytesize + c->reserved_bytes > c->gpu_memory) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            void *mapping = mmap(NULL, bytesize, PROT_READ | PROT_WRITE,
                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            struct emu_alloc *a = mapping == MAP_FAILED ? NULL : calloc(1, sizeof *a);
            if (!a) {
                if (mapping != MAP_FAILED)
                    munmap(mapping, bytesize);
                r = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                a->ptr = (CUdeviceptr)(uintptr_t)mapping;
                a->size = bytesize;
                a->device = d;
                a->ctx = ctx;
                a->next = g_allocs;
                g_allocs = a;
                *dptr = a->ptr;
                publish_gpu_locked();
            }
        }
        pthread_mutex_unlock(&g_mem_mu);
        emu_devices_unlock(lock_fd);
    }
    api_leave();
    RETURN("cuMemAlloc", r);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    BEGIN("cuMemFree");
    CUresult r = api_enter();
    if (r != CUDA_SUCCESS)
        RETURN("cuMemFree", r);
    r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mem_mu);
    for (struct emu_alloc **link = &g_allocs; *link; link = &(*link)->next)
        if ((*link)->ptr == dptr) {
            struct emu_alloc *a = *link;
            *link = a->next;
            munmap((void *)(uintptr_t)a->ptr, a->size);
            free(a);
            publish_gpu_locked();
            r = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&g_mem_mu);
    api_leave();
    RETURN("cuMemFree", r);
}

/* The host address behind [ptr, ptr + size) if it lies inside one allocation. */
static void *device_range(CUdeviceptr ptr, size_t size)
{
    void *found = NULL;
    pthread_mutex_lock(&g_mem_mu);
    for (struct emu_alloc *a = g_allocs; a; a = a->next)
        if (ptr >= a->ptr && size <= a->size && ptr - a->ptr <= a->size - size) {
            found = (void *)(uintptr_t)ptr;
            break;
        }
    pthread_mutex_unlock(&g_mem_mu);
    return found;
}

static CUresult memory_op(const char *name, CUdeviceptr ptr, size_t size, int kind,
                          unsigned int value, void *host)
{
    BEGIN(name);
    CUresult r = api_enter();
    if (r != CUDA_SUCCESS)
        RETURN(name, r);
    void *device = NULL;
    if (!valid_ctx(current_ctx()))
        r = CUDA_ERROR_INVALID_CONTEXT;
    else if (!(device = device_range(ptr, kind == 1 ? size * 4 : size)) || (kind >= 2 && !host))
        r = CUDA_ERROR_INVALID_VALUE;
    else if (kind == 0)
        memset(device, (int)(value & 0xFF), size);
    else if (kind == 1)
        for (size_t i = 0; i < size; i++)
            memcpy((char *)device + i * 4, &value, 4);
    else if (kind == 2)
        memcpy(device, host, size);
    else
        memcpy(host, device, size);
    api_leave();
    RETURN(name, r);
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    return memory_op("cuMemsetD8", dstDevice, N, 0, uc, NULL);
}

EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    return memory_op("cuMemsetD32", dstDevice, N, 1, ui, NULL);
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    return memory_op("cuMemcpyHtoD", dstDevice, ByteCount, 2, 0, (void *)srcHost);
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    return memory_op("cuMemcpyDtoH", srcDevice, ByteCount, 3, 0, dstHost);
}

/* ------------------------------------------------------------------ checkpoint API */

/* A thread id counts as its process (NVIDIA/cuda-checkpoint#41). */
static int target_process(int pid)
{
    int tgid = emu_tgid(pid);
    return tgid > 0 && emu_record(tgid) > 0 ? tgid : -1;
}

/* What GetRestoreThreadId and GetState answer for a pid that is no CUDA process.
 * The reading (docs/facts.md, driver 580.159.04): GetRestoreThreadId on a live process
 * that never touched CUDA answers CUDA_ERROR_NOT_INITIALIZED, though the caller had
 * called cuInit. The documents disagree: [ISSUES] ai-dynamo/snapshot's
 * cuda-checkpoint-helper once said "The driver uses INVALID_VALUE for a live process
 * without CUDA checkpoint state" (ai-dynamo/snapshot#109 takes either answer as "no checkpoint
 * state"); the reading wins. [CRIU] get_cuda_restore_tid treats any failure
 * there as "No need to checkpoint devices on pid". Not read yet: GetState on such a
 * process (answered as GetRestoreThreadId is: both name one target the driver holds no
 * state for) and a pid that does not exist (the [API]'s INVALID_VALUE, a bad argument,
 * as before the reading). Lock, Checkpoint, Restore and Unlock on such a pid are not
 * read either and keep INVALID_VALUE (remote()). */
static CUresult not_cuda(int pid)
{
    return emu_tgid(pid) > 0 ? CUDA_ERROR_NOT_INITIALIZED : CUDA_ERROR_INVALID_VALUE;
}

static CUresult caller_fault(int pid, const char *call)
{
    int argument = 0;
    int fault = apply_fault(pid, call, &argument);
    return fault == FAULT_FAIL || fault == FAULT_ERROR ? argument : CUDA_SUCCESS;
}

EXPORT CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
    emu_log("cuCheckpointProcessGetRestoreThreadId", pid, "begin", 0, 0);
    CUresult r = need_init();
    if (r == CUDA_SUCCESS && !tid)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        r = caller_fault(pid, "get_restore_tid");
    if (r == CUDA_SUCCESS) {
        int process = target_process(pid);
        int restore_tid = process > 0 ? emu_record(process) : -1;
        if (restore_tid > 0)
            *tid = restore_tid;
        else
            r = not_cuda(pid);
    }
    emu_log("cuCheckpointProcessGetRestoreThreadId", pid, "end", 1, r);
    return r;
}

EXPORT CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
    emu_log("cuCheckpointProcessGetState", pid, "begin", 0, 0);
    CUresult r = need_init();
    if (r == CUDA_SUCCESS && !state)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        r = caller_fault(pid, "get_state");
    if (r == CUDA_SUCCESS) {
        int process = target_process(pid);
        int current = process > 0 ? emu_read_state(process) : -1;
        if (current >= 0)
            *state = current;
        else
            r = not_cuda(pid);
    }
    emu_log("cuCheckpointProcessGetState", pid, "end", 1, r);
    return r;
}

static int send_all(int fd, const char *data, size_t length)
{
    while (length) {
        ssize_t n = send(fd, data, length, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        data += n;
        length -= (size_t)n;
    }
    return 0;
}

static int parse_reply(const char *buf, size_t used, CUresult *result)
{
    if (!memchr(buf, '\n', used))
        return 0;
    *result = atoi(buf);
    return 1;
}

/* Sends one request to the target's restore thread and waits for its answer; with a
 * deadline (the lock's timeoutMs) the wait ends there. */
static CUresult remote(int pid, const char *op, long long deadline, const char *mapping)
{
    emu_config *c = emu_config_get();
    int process = target_process(pid);
    struct sockaddr_un address;
    socklen_t length;
    if (process < 0 || socket_address(process, &address, &length) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return CUDA_ERROR_OPERATING_SYSTEM;
    /* Connecting succeeds while the target is frozen (the kernel queues it); only a
     * full backlog makes it wait, and then only until the deadline. */
    while (connect(fd, (struct sockaddr *)&address, length) != 0) {
        if (errno != EAGAIN && errno != EINTR) {
            close(fd);
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (deadline && emu_now_ns() >= deadline) {
            close(fd);
            return c->lock_timeout_result;
        }
        emu_sleep_ms(5);
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    char request[640];
    int n = snprintf(request, sizeof request, "%s %lld %d %s\n", op, deadline, (int)getpid(),
                     mapping ? mapping : "-");
    if (send_all(fd, request, (size_t)n) != 0) {
        close(fd);
        return CUDA_ERROR_INVALID_VALUE;
    }
    char reply[64];
    size_t used = 0;
    CUresult result = CUDA_ERROR_INVALID_VALUE;
    for (;;) {
        int wait_ms = -1;
        if (deadline) {
            long long left = deadline - emu_now_ns();
            if (left <= 0)
                break;
            wait_ms = (int)((left + 999999) / 1000000);
        }
        struct pollfd p = {fd, POLLIN, 0};
        int ready = poll(&p, 1, wait_ms);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0)
            continue;
        ssize_t got = recv(fd, reply + used, sizeof reply - 1 - used, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) { /* the target went away mid-call */
            close(fd);
            return CUDA_ERROR_INVALID_VALUE;
        }
        used += (size_t)got;
        reply[used] = '\0';
        if (parse_reply(reply, used, &result)) {
            close(fd);
            return result;
        }
    }
    /* Timed out. Shut down reading first: from here on the restore thread's reply
     * fails (EPIPE) and it undoes the lock; a reply that got in before is still read. */
    shutdown(fd, SHUT_RD);
    ssize_t got = recv(fd, reply + used, sizeof reply - 1 - used, MSG_DONTWAIT);
    if (got > 0) {
        used += (size_t)got;
        reply[used] = '\0';
        if (parse_reply(reply, used, &result)) {
            close(fd);
            return result;
        }
    }
    close(fd);
    return c->lock_timeout_result;
}

static int all_zero(const void *data, size_t size)
{
    const unsigned char *bytes = data;
    for (size_t i = 0; i < size; i++)
        if (bytes[i])
            return 0;
    return 1;
}

EXPORT CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
    emu_log("cuCheckpointProcessLock", pid, "begin", 0, 0);
    CUresult r = need_init();
    long long deadline = 0;
    if (r == CUDA_SUCCESS && args) {
        /* [API] reserved0 "must be zero", reserved1 "must be zeroed" */
        if (args->reserved0 || !all_zero(args->reserved1, sizeof args->reserved1))
            r = CUDA_ERROR_INVALID_VALUE;
        else if (args->timeoutMs)
            deadline = emu_now_ns() + (long long)args->timeoutMs * 1000000LL;
    }
    if (r == CUDA_SUCCESS)
        r = remote(pid, "lock", deadline, NULL);
    emu_log("cuCheckpointProcessLock", pid, "end", 1, r);
    return r;
}

EXPORT CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
    (void)args;
    emu_log("cuCheckpointProcessCheckpoint", pid, "begin", 0, 0);
    CUresult r = need_init();
    if (r == CUDA_SUCCESS)
        r = remote(pid, "checkpoint", 0, NULL);
    emu_log("cuCheckpointProcessCheckpoint", pid, "end", 1, r);
    return r;
}

EXPORT CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
    emu_log("cuCheckpointProcessRestore", pid, "begin", 0, 0);
    CUresult r = need_init();
    char mapping[512] = "-";
    if (r == CUDA_SUCCESS && args && args->gpuPairsCount) {
        /* [API] gpuPairs "remap the process old GPUs onto new GPUs" */
        size_t used = 0;
        if (!args->gpuPairs || args->gpuPairsCount > EMU_MAX_GPUS)
            r = CUDA_ERROR_INVALID_VALUE;
        for (unsigned i = 0; r == CUDA_SUCCESS && i < args->gpuPairsCount; i++) {
            int from = emu_device_for_uuid((unsigned char *)args->gpuPairs[i].oldUuid.bytes);
            int to = emu_device_for_uuid((unsigned char *)args->gpuPairs[i].newUuid.bytes);
            if (from < 0 || to < 0)
                r = CUDA_ERROR_INVALID_VALUE;
            else
                used += (size_t)snprintf(mapping + used, sizeof mapping - used, "%s%d:%d",
                                         i ? "," : "", from, to);
        }
    }
    if (r == CUDA_SUCCESS)
        r = remote(pid, "restore", 0, mapping);
    emu_log("cuCheckpointProcessRestore", pid, "end", 1, r);
    return r;
}

EXPORT CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
    (void)args;
    emu_log("cuCheckpointProcessUnlock", pid, "begin", 0, 0);
    CUresult r = need_init();
    if (r == CUDA_SUCCESS)
        r = remote(pid, "unlock", 0, NULL);
    emu_log("cuCheckpointProcessUnlock", pid, "end", 1, r);
    return r;
}

/* ------------------------------------------------------------------ cuGetProcAddress */

/* [PY] cuda-bindings (12.9+/13.x) loads the driver with cuda.pathfinder
 * (dlopen "libcuda.so.1", RTLD_NOW|RTLD_GLOBAL, so LD_LIBRARY_PATH applies), takes
 * cuGetProcAddress_v2 with dlsym, and resolves every other entry point through it by
 * BASE name and the CUDA version whose ABI it expects: ("cuCtxCreate", 3020) means
 * cuCtxCreate_v2, ("cuCtxCreate", 12050) cuCtxCreate_v4, ("cuMemAlloc", 3020)
 * cuMemAlloc_v2, the checkpoint calls at 12080. An unknown name, or one newer than the
 * emulated driver's CUDA version, returns CUDA_ERROR_NOT_FOUND with a NULL pointer,
 * and the binding raises when such a function is called. Each row: base name, the
 * CUDA version that introduced this variant, the function. */
typedef CUresult (*proc_fn)(void);
static const struct {
    const char *name;
    int version;
    void *fn;
} SYMBOLS[] = {
    {"cuGetErrorName", 6000, (void *)cuGetErrorName},
    {"cuGetErrorString", 6000, (void *)cuGetErrorString},
    {"cuInit", 2000, (void *)cuInit},
    {"cuDriverGetVersion", 2020, (void *)cuDriverGetVersion},
    {"cuDeviceGet", 2000, (void *)cuDeviceGet},
    {"cuDeviceGetCount", 2000, (void *)cuDeviceGetCount},
    {"cuDeviceGetName", 2000, (void *)cuDeviceGetName},
    {"cuDeviceGetUuid", 9020, (void *)cuDeviceGetUuid},
    {"cuDeviceGetUuid", 11040, (void *)cuDeviceGetUuid_v2},
    {"cuDeviceTotalMem", 3020, (void *)cuDeviceTotalMem_v2},
    {"cuDeviceGetAttribute", 2000, (void *)cuDeviceGetAttribute},
    {"cuDevicePrimaryCtxRetain", 7000, (void *)cuDevicePrimaryCtxRetain},
    {"cuDevicePrimaryCtxRelease", 11000, (void *)cuDevicePrimaryCtxRelease_v2},
    {"cuDevicePrimaryCtxReset", 11000, (void *)cuDevicePrimaryCtxReset_v2},
    {"cuDevicePrimaryCtxGetState", 7000, (void *)cuDevicePrimaryCtxGetState},
    {"cuCtxCreate", 3020, (void *)cuCtxCreate_v2},
    {"cuCtxCreate", 11040, (void *)cuCtxCreate_v3},
    {"cuCtxCreate", 12050, (void *)cuCtxCreate_v4},
    {"cuCtxDestroy", 4000, (void *)cuCtxDestroy_v2},
    {"cuCtxSetCurrent", 4000, (void *)cuCtxSetCurrent},
    {"cuCtxGetCurrent", 4000, (void *)cuCtxGetCurrent},
    {"cuCtxPushCurrent", 4000, (void *)cuCtxPushCurrent_v2},
    {"cuCtxPopCurrent", 4000, (void *)cuCtxPopCurrent_v2},
    {"cuCtxGetDevice", 2000, (void *)cuCtxGetDevice},
    {"cuCtxSynchronize", 2000, (void *)cuCtxSynchronize},
    {"cuCtxSynchronize", 13000, (void *)cuCtxSynchronize_v2},
    {"cuMemGetInfo", 3020, (void *)cuMemGetInfo_v2},
    {"cuMemAlloc", 3020, (void *)cuMemAlloc_v2},
    {"cuMemFree", 3020, (void *)cuMemFree_v2},
    {"cuMemsetD8", 3020, (void *)cuMemsetD8_v2},
    {"cuMemsetD32", 3020, (void *)cuMemsetD32_v2},
    {"cuMemcpyHtoD", 3020, (void *)cuMemcpyHtoD_v2},
    {"cuMemcpyDtoH", 3020, (void *)cuMemcpyDtoH_v2},
    {"cuCheckpointProcessGetRestoreThreadId", 12080, (void *)cuCheckpointProcessGetRestoreThreadId},
    {"cuCheckpointProcessGetState", 12080, (void *)cuCheckpointProcessGetState},
    {"cuCheckpointProcessLock", 12080, (void *)cuCheckpointProcessLock},
    {"cuCheckpointProcessCheckpoint", 12080, (void *)cuCheckpointProcessCheckpoint},
    {"cuCheckpointProcessRestore", 12080, (void *)cuCheckpointProcessRestore},
    {"cuCheckpointProcessUnlock", 12080, (void *)cuCheckpointProcessUnlock},
    {"cuGetProcAddress", 11030, NULL}, /* filled in below: the two loader variants */
    {"cuGetProcAddress", 12000, NULL},
};

/* CUdriverProcAddressQueryResult */
enum { PROC_SUCCESS = 0, PROC_SYMBOL_NOT_FOUND = 1, PROC_VERSION_NOT_SUFFICIENT = 2 };

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags, int *symbolStatus);

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags, int *symbolStatus)
{
    (void)flags; /* per-thread default stream variants are the same functions here */
    if (!symbol || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    int limit = cudaVersion < emu_config_get()->cuda_version ? cudaVersion
                                                             : emu_config_get()->cuda_version;
    int best = -1, named = 0;
    for (size_t i = 0; i < sizeof SYMBOLS / sizeof SYMBOLS[0]; i++) {
        if (strcmp(SYMBOLS[i].name, symbol) != 0)
            continue;
        named = 1;
        if (SYMBOLS[i].version <= limit && (best < 0 || SYMBOLS[i].version > SYMBOLS[best].version))
            best = (int)i;
    }
    *pfn = NULL;
    if (best < 0) {
        if (symbolStatus)
            *symbolStatus = named ? PROC_VERSION_NOT_SUFFICIENT : PROC_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    void *fn = SYMBOLS[best].fn;
    if (strcmp(symbol, "cuGetProcAddress") == 0)
        fn = SYMBOLS[best].version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
    *pfn = fn;
    if (symbolStatus)
        *symbolStatus = PROC_SUCCESS;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, NULL);
}
