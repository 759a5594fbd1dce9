/*
 * libnvidia-ml.so.1 for tests: the NVML calls timeshare makes through pynvml
 * (nvidia-ml-py), answered from the emulator's state directory, so a process's memory
 * is what the emulated libcuda.so.1 says it holds and really disappears while the
 * process is checkpointed ([README] NVIDIA/cuda-checkpoint: nvidia-smi no longer lists a
 * suspended process; "570 Features: NVML support").
 *
 * pynvml resolves functions by name with ctypes (getattr on CDLL("libnvidia-ml.so.1")),
 * so these exact symbols must exist: nvmlInitWithFlags (nvmlInit calls it),
 * nvmlShutdown, nvmlErrorString, nvmlSystemGetDriverVersion, nvmlDeviceGetCount_v2,
 * nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetName, nvmlDeviceGetUUID,
 * nvmlDeviceGetMemoryInfo (and _v2 when a version is passed),
 * nvmlDeviceGetUtilizationRates and nvmlDeviceGetComputeRunningProcesses_v3 (what
 * pynvml's unversioned nvmlDeviceGetComputeRunningProcesses calls) or _v2. The plain
 * names of older NVML versions are exported too.
 *
 * Structures as nvml.h declares them:
 *   nvmlMemory_t         { unsigned long long total, free, used; }
 *   nvmlMemory_v2_t      { unsigned int version; unsigned long long total, reserved,
 *                          free, used; }, version nvmlMemory_v2 = 0x02000028
 *   nvmlProcessInfo_v1_t { unsigned int pid; unsigned long long usedGpuMemory; }
 *   nvmlProcessInfo_t (v2, v3) adds unsigned int gpuInstanceId, computeInstanceId
 *                        (0xFFFFFFFF without MIG)
 *   nvmlUtilization_t    { unsigned int gpu, memory; }
 * usedGpuMemory is NVML_VALUE_NOT_AVAILABLE (0xFFFFFFFFFFFFFFFF) where the driver
 * cannot account per process (nvml.h: "Under WDDM ... not available"; also MIG
 * without per-instance accounting): TIMESHARE_EMULATOR_NVML_PROCESS_MEMORY=unavailable.
 *
 * Return codes follow nvml.h: a too-small process array gives
 * NVML_ERROR_INSUFFICIENT_SIZE with the needed count; calls before nvmlInit give
 * NVML_ERROR_UNINITIALIZED; a bad index or handle NVML_ERROR_INVALID_ARGUMENT.
 */
#include "emulator.h"

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_VALUE_NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFULL
#define NVML_MEMORY_V2 0x02000028u

typedef struct nvml_device {
    int index;
} *nvmlDevice_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

static struct nvml_device g_devices[EMU_MAX_GPUS];
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_refcount;

#define BEGIN(name) emu_log(name, (int)getpid(), "begin", 0, 0)
#define RETURN(name, result)                                                                       \
    do {                                                                                           \
        nvmlReturn_t result_ = (result);                                                           \
        emu_log(name, (int)getpid(), "end", 1, result_);                                           \
        return result_;                                                                            \
    } while (0)

static int initialized(void)
{
    pthread_mutex_lock(&g_mu);
    int yes = g_refcount > 0;
    pthread_mutex_unlock(&g_mu);
    return yes;
}

static nvmlReturn_t check_device(nvmlDevice_t device)
{
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!device || device < g_devices || device >= g_devices + emu_config_get()->gpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    BEGIN("nvmlInitWithFlags");
    emu_config *c = emu_config_get();
    if (c->nvml_init_error)
        RETURN("nvmlInitWithFlags", c->nvml_init_error);
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < EMU_MAX_GPUS; i++)
        g_devices[i].index = i;
    g_refcount++;
    pthread_mutex_unlock(&g_mu);
    RETURN("nvmlInitWithFlags", NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    BEGIN("nvmlShutdown");
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&g_mu);
    if (g_refcount == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else
        g_refcount--;
    pthread_mutex_unlock(&g_mu);
    RETURN("nvmlShutdown", r);
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    BEGIN("nvmlSystemGetDriverVersion");
    if (!initialized())
        RETURN("nvmlSystemGetDriverVersion", NVML_ERROR_UNINITIALIZED);
    RETURN("nvmlSystemGetDriverVersion", copy_text(emu_config_get()->driver, version, length));
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version)
{
    BEGIN("nvmlSystemGetCudaDriverVersion");
    if (!version)
        RETURN("nvmlSystemGetCudaDriverVersion", NVML_ERROR_INVALID_ARGUMENT);
    *version = emu_config_get()->cuda_version;
    RETURN("nvmlSystemGetCudaDriverVersion", NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version)
{
    return nvmlSystemGetCudaDriverVersion(version);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    BEGIN("nvmlDeviceGetCount");
    if (!initialized())
        RETURN("nvmlDeviceGetCount", NVML_ERROR_UNINITIALIZED);
    if (!count)
        RETURN("nvmlDeviceGetCount", NVML_ERROR_INVALID_ARGUMENT);
    *count = (unsigned int)emu_config_get()->gpus;
    RETURN("nvmlDeviceGetCount", NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count)
{
    return nvmlDeviceGetCount_v2(count);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    BEGIN("nvmlDeviceGetHandleByIndex");
    if (!initialized())
        RETURN("nvmlDeviceGetHandleByIndex", NVML_ERROR_UNINITIALIZED);
    if (!device || index >= (unsigned int)emu_config_get()->gpus)
        RETURN("nvmlDeviceGetHandleByIndex", NVML_ERROR_INVALID_ARGUMENT);
    *device = &g_devices[index];
    RETURN("nvmlDeviceGetHandleByIndex", NVML_SUCCESS);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    BEGIN("nvmlDeviceGetHandleByUUID");
    if (!initialized())
        RETURN("nvmlDeviceGetHandleByUUID", NVML_ERROR_UNINITIALIZED);
    if (!uuid || !device)
        RETURN("nvmlDeviceGetHandleByUUID", NVML_ERROR_INVALID_ARGUMENT);
    for (int i = 0; i < emu_config_get()->gpus; i++) {
        char text[96];
        emu_uuid_text(i, text, sizeof text);
        if (strcmp(text, uuid) == 0) {
            *device = &g_devices[i];
            RETURN("nvmlDeviceGetHandleByUUID", NVML_SUCCESS);
        }
    }
    RETURN("nvmlDeviceGetHandleByUUID", NVML_ERROR_NOT_FOUND);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    BEGIN("nvmlDeviceGetIndex");
    nvmlReturn_t r = check_device(device);
    if (r == NVML_SUCCESS && !index)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *index = (unsigned int)device->index;
    RETURN("nvmlDeviceGetIndex", r);
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    BEGIN("nvmlDeviceGetName");
    nvmlReturn_t r = check_device(device);
    if (r == NVML_SUCCESS)
        r = copy_text(emu_config_get()->gpu_name, name, length);
    RETURN("nvmlDeviceGetName", r);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    BEGIN("nvmlDeviceGetUUID");
    nvmlReturn_t r = check_device(device);
    if (r == NVML_SUCCESS) {
        char text[96];
        emu_uuid_text(device->index, text, sizeof text);
        r = copy_text(text, uuid, length);
    }
    RETURN("nvmlDeviceGetUUID", r);
}

struct listing {
    int device;
    unsigned int count;
    unsigned int capacity;
    nvmlProcessInfo_t *infos;
};

static void list_process(int pid, void *arg)
{
    struct listing *listing = arg;
    unsigned long long bytes[EMU_MAX_GPUS];
    int present[EMU_MAX_GPUS];
    emu_read_gpu(pid, bytes, present);
    if (!present[listing->device])
        return;
    if (listing->infos && listing->count < listing->capacity) {
        nvmlProcessInfo_t *info = &listing->infos[listing->count];
        info->pid = (unsigned int)pid;
        info->usedGpuMemory = emu_config_get()->nvml_memory_unavailable
                                  ? NVML_VALUE_NOT_AVAILABLE_ULL
                                  : bytes[listing->device];
        info->gpuInstanceId = 0xFFFFFFFFu;
        info->computeInstanceId = 0xFFFFFFFFu;
    }
    listing->count++;
}

static void device_used(int device, unsigned long long *total, unsigned long long *used)
{
    emu_config *c = emu_config_get();
    unsigned long long bytes[EMU_MAX_GPUS];
    emu_device_usage(0, bytes);
    *total = c->gpu_memory;
    *used = bytes[device] + c->reserved_bytes;
    if (*used > *total)
        *used = *total;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    BEGIN("nvmlDeviceGetMemoryInfo");
    nvmlReturn_t r = check_device(device);
    if (r == NVML_SUCCESS && !memory)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS) {
        device_used(device->index, &memory->total, &memory->used);
        memory->free = memory->total - memory->used;
    }
    RETURN("nvmlDeviceGetMemoryInfo", r);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    BEGIN("nvmlDeviceGetMemoryInfo_v2");
    nvmlReturn_t r = check_device(device);
    if (r == NVML_SUCCESS && !memory)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (r == NVML_SUCCESS && memory->version != NVML_MEMORY_V2)
        r = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (r == NVML_SUCCESS) {
        device_used(device->index, &memory->total, &memory->used);
        memory->reserved = emu_config_get()->reserved_bytes;
        memory->free = memory->total - memory->used;
    }
    RETURN("nvmlDeviceGetMemoryInfo_v2", r);
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                  nvmlUtilization_t *utilization)
{
    BEGIN("nvmlDeviceGetUtilizationRates");
    nvmlReturn_t r = check_device(device);
    int percent = emu_config_get()->utilization;
    if (r == NVML_SUCCESS && !utilization)
        r = NVML_ERROR_INVALID_ARGUMENT;
    else if (r == NVML_SUCCESS && percent < 0)
        r = NVML_ERROR_NOT_SUPPORTED; /* e.g. a MIG slice has no utilization counter */
    if (r == NVML_SUCCESS) {
        utilization->gpu = (unsigned int)percent;
        utilization->memory = 0;
    }
    RETURN("nvmlDeviceGetUtilizationRates", r);
}

/* nvml.h, nvmlDeviceGetComputeRunningProcesses: "If the supplied array is not large
 * enough ... NVML_ERROR_INSUFFICIENT_SIZE will be returned and infoCount set to the
 * needed size"; infos may be NULL when *infoCount is 0. */
static nvmlReturn_t compute_processes(nvmlDevice_t device, unsigned int *count,
                                      nvmlProcessInfo_t *infos)
{
    nvmlReturn_t r = check_device(device);
    if (r != NVML_SUCCESS)
        return r;
    if (!count || (*count && !infos))
        return NVML_ERROR_INVALID_ARGUMENT;
    struct listing listing = {device->index, 0, *count, infos};
    emu_each_process(list_process, &listing);
    int enough = listing.count <= *count;
    *count = listing.count;
    return enough ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    BEGIN("nvmlDeviceGetComputeRunningProcesses_v3");
    RETURN("nvmlDeviceGetComputeRunningProcesses_v3", compute_processes(device, infoCount, infos));
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                            unsigned int *infoCount,
                                                            nvmlProcessInfo_t *infos)
{
    BEGIN("nvmlDeviceGetComputeRunningProcesses_v2");
    RETURN("nvmlDeviceGetComputeRunningProcesses_v2", compute_processes(device, infoCount, infos));
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                         unsigned int *infoCount,
                                                         nvmlProcessInfo_v1_t *infos)
{
    BEGIN("nvmlDeviceGetComputeRunningProcesses");
    nvmlProcessInfo_t *wide = NULL;
    if (infoCount && *infoCount && infos) {
        wide = calloc(*infoCount, sizeof *wide);
        if (!wide)
            RETURN("nvmlDeviceGetComputeRunningProcesses", NVML_ERROR_UNKNOWN);
    }
    nvmlReturn_t r = compute_processes(device, infoCount, wide ? wide : (nvmlProcessInfo_t *)infos);
    if (wide) {
        if (r == NVML_SUCCESS)
            for (unsigned int i = 0; i < *infoCount; i++) {
                infos[i].pid = wide[i].pid;
                infos[i].usedGpuMemory = wide[i].usedGpuMemory;
            }
        free(wide);
    }
    RETURN("nvmlDeviceGetComputeRunningProcesses", r);
}

/* No graphics clients on an emulated compute GPU. */
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                             unsigned int *infoCount,
                                                             nvmlProcessInfo_t *infos)
{
    (void)infos;
    BEGIN("nvmlDeviceGetGraphicsRunningProcesses_v3");
    nvmlReturn_t r = check_device(device);
    if (r == NVML_SUCCESS && !infoCount)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *infoCount = 0;
    RETURN("nvmlDeviceGetGraphicsRunningProcesses_v3", r);
}
