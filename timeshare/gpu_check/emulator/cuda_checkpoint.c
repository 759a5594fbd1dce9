/*
 * cuda-checkpoint for tests: NVIDIA's utility's command line on top of the emulated
 * libcuda.so.1 (linked with an rpath to the build directory, as the real utility
 * links libcuda.so.1). The real binary is a thin front end: it calls
 * cuDriverGetVersion and takes the rest from the driver, printing "Insufficient
 * driver" when the driver is too old.
 *
 * Interface, from NVIDIA/cuda-checkpoint README.md (r570 `--help`, 580.65.06 `--help`
 * quoted in NVIDIA/cuda-checkpoint#18, r550 `--help` in the first README):
 *   --get-state --pid <pid>          prints running|locked|checkpointed|failed
 *                                    (CRIU's cuda_plugin.c matches these prefixes)
 *   --action lock|checkpoint|restore|unlock --pid <pid> [--timeout <ms>]
 *                                    [--device-map old=new,...]  (restore only)
 *   --toggle --pid <pid>             running -> lock+checkpoint; checkpointed ->
 *                                    restore+unlock
 *   --get-restore-tid --pid <pid>    prints the tid (CRIU atoi()s the output)
 *   --help|-h                        help on stdout, exit 0 (CRIU greps it for
 *                                    "--action" to tell an r550 toggle-only utility)
 * Errors go to stderr with exit status 1, in the utility's words as quoted in the
 * issues: 'Could not restore on process ID 3406143: "invalid argument"'
 * (NVIDIA/cuda-checkpoint#47),
 * 'Error toggling CUDA in process ID 98145: "operation not permitted"'
 * (NVIDIA/cuda-checkpoint#25),
 * 'Error initializing CUDA: "OS call failed or operation not supported on this OS"'
 * (kaito-project/grit#9). The --get-state and --get-restore-tid failure texts follow
 * nvsnap-cuda-checkpoint, a drop-in replacement written to match the utility.
 *
 * TIMESHARE_EMULATOR_TOGGLE_ONLY=1 makes it the r550 utility: only --toggle and
 * --help exist.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef struct {
    unsigned int timeoutMs;
    unsigned int reserved0;
    unsigned long long reserved1[7];
} CUcheckpointLockArgs;
typedef struct {
    unsigned long long reserved[8];
} CUcheckpointArgs;
typedef struct {
    char bytes[16];
} CUuuid;
typedef struct {
    CUuuid oldUuid;
    CUuuid newUuid;
} CUcheckpointGpuPair;
typedef struct {
    CUcheckpointGpuPair *gpuPairs;
    unsigned int gpuPairsCount;
    unsigned int padding;
    unsigned long long reserved[7];
} CUcheckpointRestoreArgs;

CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuGetErrorString(CUresult error, const char **text);
CUresult cuCheckpointProcessGetState(int pid, int *state);
CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid);
CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args);
CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointArgs *args);
CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args);
CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointArgs *args);

static const char *text(CUresult r)
{
    const char *s = NULL;
    cuGetErrorString(r, &s);
    return s ? s : "unknown error";
}

static const char *STATES[] = {"running", "locked", "checkpointed", "failed", "checkpointing",
                               "restoring"};

static const char *driver_version(void)
{
    const char *v = getenv("TIMESHARE_EMULATOR_DRIVER");
    return v && *v ? v : "580.65.06";
}

static void help(FILE *out, int toggle_only)
{
    if (toggle_only) {
        fprintf(out,
                "CUDA checkpoint and restore utility.\n"
                "Toggles the state of CUDA within a process between suspended and running.\n"
                "Version %s. Copyright (C) 2024 NVIDIA Corporation. All rights reserved.\n\n"
                "    --toggle --pid <value>\n"
                "        Toggle the state of CUDA in the specified process.\n\n"
                "    --help\n"
                "        Print help message.\n\n",
                driver_version());
        return;
    }
    fprintf(out,
            "CUDA checkpoint and restore utility.\n"
            "Version %s. Copyright (C) 2025 NVIDIA Corporation. All rights reserved.\n\n"
            "Operations:\n"
            "--get-state --pid <pid>\n"
            "\tPrints the current checkpoint state of the process specified by <pid>\n\n"
            "--action lock | checkpoint | restore | unlock --pid <pid> [--timeout <ms>] "
            "[--device-map <uuids>]\n"
            "\tPerforms the specified action on <pid>.\n"
            "\tFor the lock action a timeout can be provided, the lock operation will wait up "
            "to <ms> milliseconds for the operation to succeed.\n"
            "\tFor the restore action a device map can be provided in the format "
            "oldUuid=newUuid,oldUuid=newUuid,... which will be used to remap old devices to "
            "new devices.\n\n"
            "--toggle --pid <pid>\n"
            "\tToggles the CUDA state in the specified process between the running and "
            "checkpointed states\n\n"
            "--get-restore-tid --pid <pid>\n"
            "\tRetrieves the CUDA restore thread ID of the process specified by <pid>\n\n"
            "Options:\n"
            "--pid|-p <pid>\n"
            "\tThe pid upon which to perform the operation\n\n"
            "--timeout|-t <timeout>\n"
            "\tOptional timeout that can be specified for the lock action in milliseconds\n\n"
            "--device-map|-d <device map>\n"
            "\tOptional device map for the restore action\n\n"
            "--help|-h\n"
            "\tPrint this help message\n",
            driver_version());
}

static int usage_error(const char *message, int toggle_only)
{
    fprintf(stderr, "%s\n", message);
    help(stderr, toggle_only);
    return 1;
}

static int action_error(const char *action, int pid, CUresult r)
{
    fprintf(stderr, "Could not %s on process ID %d: \"%s\"\n", action, pid, text(r));
    return 1;
}

static int parse_uuid(const char *text_uuid, CUuuid *out)
{
    const char *p = text_uuid;
    if (strncmp(p, "GPU-", 4) == 0)
        p += 4;
    int n = 0;
    while (*p && n < 16) {
        if (*p == '-') {
            p++;
            continue;
        }
        unsigned value;
        if (sscanf(p, "%2x", &value) != 1)
            return -1;
        out->bytes[n++] = (char)value;
        p += 2;
    }
    return n == 16 && !*p ? 0 : -1;
}

static int restore(int pid, const char *device_map)
{
    CUcheckpointRestoreArgs args;
    CUcheckpointGpuPair pairs[16];
    memset(&args, 0, sizeof args);
    if (device_map) {
        char copy[1024];
        snprintf(copy, sizeof copy, "%s", device_map);
        char *save = NULL;
        for (char *pair = strtok_r(copy, ",", &save); pair; pair = strtok_r(NULL, ",", &save)) {
            char *equals = strchr(pair, '=');
            if (!equals || args.gpuPairsCount == 16)
                return usage_error("Invalid device map", 0);
            *equals = '\0';
            CUcheckpointGpuPair *p = &pairs[args.gpuPairsCount++];
            if (parse_uuid(pair, &p->oldUuid) || parse_uuid(equals + 1, &p->newUuid))
                return usage_error("Invalid device map", 0);
        }
        args.gpuPairs = pairs;
    }
    CUresult r = cuCheckpointProcessRestore(pid, &args);
    return r ? action_error("restore", pid, r) : 0;
}

static int act(const char *action, int pid, unsigned timeout, const char *device_map)
{
    CUresult r;
    if (strcmp(action, "lock") == 0) {
        CUcheckpointLockArgs args;
        memset(&args, 0, sizeof args);
        args.timeoutMs = timeout;
        r = cuCheckpointProcessLock(pid, &args);
    } else if (strcmp(action, "checkpoint") == 0) {
        CUcheckpointArgs args;
        memset(&args, 0, sizeof args);
        r = cuCheckpointProcessCheckpoint(pid, &args);
    } else if (strcmp(action, "restore") == 0) {
        return restore(pid, device_map);
    } else if (strcmp(action, "unlock") == 0) {
        CUcheckpointArgs args;
        memset(&args, 0, sizeof args);
        r = cuCheckpointProcessUnlock(pid, &args);
    } else {
        return usage_error("Invalid action", 0);
    }
    return r ? action_error(action, pid, r) : 0;
}

static int toggle(int pid)
{
    int state = 0;
    CUresult r = cuCheckpointProcessGetState(pid, &state);
    CUcheckpointLockArgs lock;
    CUcheckpointArgs plain;
    CUcheckpointRestoreArgs restore_args;
    memset(&lock, 0, sizeof lock);
    memset(&plain, 0, sizeof plain);
    memset(&restore_args, 0, sizeof restore_args);
    if (r == 0 && state == 0) {
        r = cuCheckpointProcessLock(pid, &lock);
        if (r == 0)
            r = cuCheckpointProcessCheckpoint(pid, &plain);
    } else if (r == 0 && state == 2) {
        r = cuCheckpointProcessRestore(pid, &restore_args);
        if (r == 0)
            r = cuCheckpointProcessUnlock(pid, &plain);
    } else if (r == 0) {
        r = 401; /* CUDA_ERROR_ILLEGAL_STATE: neither running nor checkpointed */
    }
    if (r) {
        fprintf(stderr, "Error toggling CUDA in process ID %d: \"%s\"\n", pid, text(r));
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *toggle_env = getenv("TIMESHARE_EMULATOR_TOGGLE_ONLY");
    int toggle_only = toggle_env && strcmp(toggle_env, "1") == 0;
    int pid = -1, get_state = 0, get_tid = 0, do_toggle = 0;
    unsigned timeout = 0;
    const char *action = NULL, *device_map = NULL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            help(stdout, toggle_only);
            return 0;
        } else if (!strcmp(a, "--toggle")) {
            do_toggle = 1;
        } else if ((!strcmp(a, "--pid") || (!toggle_only && !strcmp(a, "-p"))) && has_value) {
            pid = atoi(argv[++i]);
        } else if (toggle_only) {
            return usage_error("Unrecognized option", 1);
        } else if (!strcmp(a, "--get-state")) {
            get_state = 1;
        } else if (!strcmp(a, "--get-restore-tid")) {
            get_tid = 1;
        } else if ((!strcmp(a, "--action") || !strcmp(a, "-a")) && has_value) {
            action = argv[++i];
        } else if ((!strcmp(a, "--timeout") || !strcmp(a, "-t")) && has_value) {
            timeout = (unsigned)strtoul(argv[++i], NULL, 10);
        } else if ((!strcmp(a, "--device-map") || !strcmp(a, "-d")) && has_value) {
            device_map = argv[++i];
        } else {
            return usage_error("Unrecognized option", 0);
        }
    }
    if (get_state + get_tid + do_toggle + (action != NULL) != 1 || pid <= 0)
        return usage_error("Exactly one operation and a --pid are required", toggle_only);

    int version = 0;
    if (cuDriverGetVersion(&version) != 0 || version < 12040) {
        fprintf(stderr, "Insufficient driver\n");
        return 1;
    }
    CUresult r = cuInit(0);
    if (r) {
        fprintf(stderr, "Error initializing CUDA: \"%s\"\n", text(r));
        return 1;
    }
    if (do_toggle)
        return toggle(pid);
    if (get_state) {
        int state = 0;
        r = cuCheckpointProcessGetState(pid, &state);
        if (r) {
            fprintf(stderr, "Error getting process state for process ID %d: \"%s\"\n", pid,
                    text(r));
            return 1;
        }
        printf("%s\n", state >= 0 && state < 6 ? STATES[state] : "unknown");
        return 0;
    }
    if (get_tid) {
        int tid = 0;
        r = cuCheckpointProcessGetRestoreThreadId(pid, &tid);
        if (r) {
            /* docs/facts.md (utility 580.159.04): for a process without CUDA, exit 1 and
             * exactly this line on stderr. What the utility prints when the call fails
             * otherwise is not read; nvsnap-cuda-checkpoint prints this line for any
             * failure, and so does this one. */
            fprintf(stderr, "Could not find restore thread for process ID %d\n", pid);
            return 1;
        }
        printf("%d\n", tid);
        return 0;
    }
    return act(action, pid, timeout, device_map);
}
