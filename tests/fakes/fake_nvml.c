/*
 * A fake libnvidia-ml.so.1 for hosts without GPUs: the C symbols modelwake's NVML binding
 * (plugins/module_utils/host/nvml.py) calls, answering from the same scripted GPU picture as
 * tests/fakes/nvidia-smi, so the binding is tested through ctypes exactly as on a GPU host.
 *
 * Reads ${MODELWAKE_FAKE_GPU_DIR:-/run/modelwake-fake-gpu}:
 *   gpus.json          {"gpus": [{"index", "uuid", "memory_total_mib", "memory_used_mib",
 *                                 "memory_reserved_mib" (the driver's own, default 0),
 *                                 "utilization_gpu" (null: Not Supported)}, ...]}
 *   holder-<name>.json {"pid": 1234, "gpus": {"0": {"memory_mib": 76000, "utilization": 0}}}
 * The GPU health preflight's answers, per GPU in gpus.json (healthy when left out):
 *   "persistence_mode" true|false (default true), "remapped_rows" null (Not Supported: before
 *   Ampere) or {"correctable", "uncorrectable", "pending" (0/1), "failure" (0/1)} (default all 0),
 *   "fabric" {"state": "not_started"|"in_progress"|"completed", "status" (an nvmlReturn_t)} (left
 *   out: Not Supported, a GPU on no NVSwitch fabric); at the top, "driver_version" (default
 *   "580.95.05") and "cuda_driver_version" (default 13000, CUDA 13.0).
 * (A holder's "pid_namespace", written by an engine in a container, is resolved by the scripted nvidia-smi
 * only: this library runs in the unit tests, where no engine runs in a container.)
 * A holder whose pid is gone (or a zombie) holds nothing, as on a real GPU. The picture is read
 * again when the directory changed (the writers replace files atomically) or 0.2 s have passed.
 *
 * MODELWAKE_FAKE_NVML_INIT_ERROR=<code> makes nvmlInit_v2 fail with that NVML return code (9:
 * driver not loaded). MODELWAKE_FAKE_NVML_V1_ONLY=1 leaves out nvmlDeviceGetMemoryInfo_v2's answer
 * (Function Not Found, as a driver before 510). fakeNvmlCalls(name) tells tests how often a symbol
 * was called. MODELWAKE_FAKE_NVML_BLOCK=<symbol> makes that call never return (a driver wedged by a
 * GPU fault): the caller's thread sleeps in it for good.
 * A GPU's "bus_id" in gpus.json ("00000000:41:00.0", as nvidia-smi's pci.bus_id; default
 * 00000000:<0x18 + index>:00.0, as tests/fakes/nvidia-smi) answers nvmlDeviceGetPciInfo_v3.
 *
 * Memory as a real driver counts it (seen on an H200, driver 580): the first version's `used`
 * includes the reserved memory, nvmlDeviceGetMemoryInfo_v2's does not (nvidia-smi's figure), and
 * `free` excludes it in both.
 *
 * Build: cc -shared -fPIC -O2 -o libnvidia-ml.so.1 fake_nvml.c (tests/fakes/fake_nvml.py does).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25

#define MAX_GPUS 64
#define MAX_PROCS 256
#define MIB (1024ULL * 1024ULL)

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24)))
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;

typedef struct {
    int index;
    char uuid[96];
    unsigned long long total_mib, used_mib, reserved_mib;
    int util; /* -1: Not Supported */
    unsigned int pci_domain, pci_bus, pci_device;
} gpu_t;

typedef struct { unsigned int pid; int gpu; unsigned long long memory_mib; } proc_t;

static gpu_t gpus[MAX_GPUS];
static int gpu_count = -1;
static proc_t procs[MAX_PROCS];
static int proc_count;
static int initialised;
static struct timespec dir_mtime, loaded_at;

static const char *names[] = {"nvmlInit_v2", "nvmlShutdown", "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2",
                              "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
                              "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetUUID",
                              "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetPciInfo_v3",
                              "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetGpuFabricInfo",
                              "nvmlSystemGetDriverVersion", "nvmlSystemGetCudaDriverVersion_v2", NULL};
static int calls[32];

static void block_if_asked(const char *name);

static void count(const char *name) {
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], name) == 0) calls[i]++;
    block_if_asked(name);
}

/* MODELWAKE_FAKE_NVML_BLOCK: this call never returns, as on a driver an uncorrectable ECC error wedged. */
static void block_if_asked(const char *name) {
    const char *blocked = getenv("MODELWAKE_FAKE_NVML_BLOCK");
    if (!blocked || strcmp(blocked, name) != 0) return;
    for (;;) sleep(3600);
}

int fakeNvmlCalls(const char *name) {
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], name) == 0) return calls[i];
    return -1;
}

static const char *fake_dir(void) {
    const char *dir = getenv("MODELWAKE_FAKE_GPU_DIR");
    return dir && *dir ? dir : "/run/modelwake-fake-gpu";
}

static char *read_file(const char *path) {
    FILE *file = fopen(path, "r");
    if (!file) return NULL;
    size_t size = 0, cap = 4096;
    char *text = malloc(cap);
    size_t got;
    while (text && (got = fread(text + size, 1, cap - size - 1, file)) > 0) {
        size += got;
        if (size + 1 == cap) text = realloc(text, cap *= 2);
    }
    fclose(file);
    if (text) text[size] = '\0';
    return text;
}

/* The value after "key": within [start, end), whitespace skipped; NULL when absent. These files
   are written by our own code (json.dump): flat objects, no escaped quotes in the keys read. */
static const char *value_of(const char *start, const char *end, const char *key) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    for (const char *at = strstr(start, quoted); at && at < end; at = strstr(at + 1, quoted)) {
        const char *p = at + strlen(quoted);
        while (*p == ' ' || *p == '\n' || *p == '\t') p++;
        if (*p != ':') continue;
        p++;
        while (*p == ' ' || *p == '\n' || *p == '\t') p++;
        return p < end ? p : NULL;
    }
    return NULL;
}

static long long number_of(const char *start, const char *end, const char *key, long long fallback) {
    const char *p = value_of(start, end, key);
    if (!p || strncmp(p, "null", 4) == 0) return fallback;
    return strtoll(p, NULL, 10);
}

static const char *object_end(const char *open) {
    int depth = 0;
    for (const char *p = open; *p; p++) {
        if (*p == '{') depth++;
        if (*p == '}' && --depth == 0) return p;
    }
    return NULL;
}

static int pid_alive(unsigned int pid) {
    char path[64], stat[512];
    snprintf(path, sizeof path, "/proc/%u/stat", pid);
    FILE *file = fopen(path, "r");
    if (!file) return 0;
    size_t got = fread(stat, 1, sizeof stat - 1, file);
    fclose(file);
    stat[got] = '\0';
    char *paren = strrchr(stat, ')');
    return paren && paren[1] == ' ' && paren[2] != 'Z';
}

/* "bus_id": "00000000:41:00.0" (nvidia-smi's pci.bus_id), else the scripted nvidia-smi's default. */
static void load_bus_id(gpu_t *gpu, const char *open, const char *close) {
    gpu->pci_domain = 0;
    gpu->pci_bus = 0x18 + (unsigned int)gpu->index;
    gpu->pci_device = 0;
    const char *bus_id = value_of(open, close, "bus_id");
    unsigned int domain, bus, device;
    if (bus_id && *bus_id == '"' && sscanf(bus_id + 1, "%x:%x:%x", &domain, &bus, &device) == 3) {
        gpu->pci_domain = domain;
        gpu->pci_bus = bus;
        gpu->pci_device = device;
    }
}

/* The GPU health preflight's picture (persistence mode, remapped rows, fabric, driver), kept apart
   from gpu_t: health[i] belongs to gpus[i]. */
#define FABRIC_NOT_SUPPORTED 0
#define FABRIC_NOT_STARTED 1
#define FABRIC_IN_PROGRESS 2
#define FABRIC_COMPLETED 3

typedef struct {
    int persistence;
    int remap_supported;
    unsigned int remap_correctable, remap_uncorrectable, remap_pending, remap_failure;
    int fabric_state, fabric_status;
} health_t;

typedef struct { unsigned char clusterUuid[16]; int status; unsigned int cliqueId; unsigned char state; } nvmlGpuFabricInfo_t;

static health_t health[MAX_GPUS];
static char driver_version[80] = "580.95.05";
static int cuda_driver_version = 13000;

static int flag_of(const char *start, const char *end, const char *key, int fallback) {
    const char *p = value_of(start, end, key);
    if (!p) return fallback;
    if (strncmp(p, "true", 4) == 0) return 1;
    if (strncmp(p, "false", 5) == 0 || strncmp(p, "null", 4) == 0) return 0;
    return strtol(p, NULL, 10) != 0;
}

static void load_system(const char *start, const char *end) {
    snprintf(driver_version, sizeof driver_version, "580.95.05");
    const char *driver = value_of(start, end, "driver_version");
    if (driver && *driver == '"') {
        const char *last = strchr(driver + 1, '"');
        if (last && last - driver - 1 < (long)sizeof driver_version) {
            memcpy(driver_version, driver + 1, last - driver - 1);
            driver_version[last - driver - 1] = '\0';
        }
    }
    cuda_driver_version = (int)number_of(start, end, "cuda_driver_version", 13000);
}

static void load_health(const char *open, const char *close, health_t *h) {
    h->persistence = flag_of(open, close, "persistence_mode", 1);
    h->remap_supported = 1;
    h->remap_correctable = h->remap_uncorrectable = h->remap_pending = h->remap_failure = 0;
    const char *rows = value_of(open, close, "remapped_rows");
    if (rows && strncmp(rows, "null", 4) == 0) h->remap_supported = 0;
    if (rows && *rows == '{') {
        const char *rows_end = object_end(rows);
        h->remap_correctable = (unsigned int)number_of(rows, rows_end, "correctable", 0);
        h->remap_uncorrectable = (unsigned int)number_of(rows, rows_end, "uncorrectable", 0);
        h->remap_pending = (unsigned int)flag_of(rows, rows_end, "pending", 0);
        h->remap_failure = (unsigned int)flag_of(rows, rows_end, "failure", 0);
    }
    h->fabric_state = FABRIC_NOT_SUPPORTED;
    h->fabric_status = NVML_SUCCESS;
    const char *fabric = value_of(open, close, "fabric");
    if (fabric && *fabric == '{') {
        const char *fabric_end = object_end(fabric);
        const char *state = value_of(fabric, fabric_end, "state");
        if (state && strncmp(state, "\"not_started\"", 13) == 0) h->fabric_state = FABRIC_NOT_STARTED;
        else if (state && strncmp(state, "\"in_progress\"", 13) == 0) h->fabric_state = FABRIC_IN_PROGRESS;
        else if (state && strncmp(state, "\"completed\"", 11) == 0) h->fabric_state = FABRIC_COMPLETED;
        h->fabric_status = (int)number_of(fabric, fabric_end, "status", NVML_SUCCESS);
    }
}

static void load_gpus(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/gpus.json", dir);
    char *text = read_file(path);
    gpu_count = -1;
    if (!text) return;
    gpu_count = 0;
    load_system(text, text + strlen(text));
    const char *list = value_of(text, text + strlen(text), "gpus");
    for (const char *open = list ? strchr(list, '{') : NULL; open && gpu_count < MAX_GPUS; open = strchr(open + 1, '{')) {
        const char *close = object_end(open);
        if (!close) break;
        gpu_t *gpu = &gpus[gpu_count];
        gpu->index = (int)number_of(open, close, "index", gpu_count);
        snprintf(gpu->uuid, sizeof gpu->uuid, "GPU-00000000-0000-0000-0000-%012d", gpu->index);
        const char *uuid = value_of(open, close, "uuid");
        if (uuid && *uuid == '"') {
            const char *last = strchr(uuid + 1, '"');
            if (last && last - uuid - 1 < (long)sizeof gpu->uuid) {
                memcpy(gpu->uuid, uuid + 1, last - uuid - 1);
                gpu->uuid[last - uuid - 1] = '\0';
            }
        }
        gpu->total_mib = number_of(open, close, "memory_total_mib", 97887);
        gpu->used_mib = number_of(open, close, "memory_used_mib", 0);
        gpu->reserved_mib = number_of(open, close, "memory_reserved_mib", 0);
        const char *util = value_of(open, close, "utilization_gpu");
        gpu->util = util && strncmp(util, "null", 4) == 0 ? -1 : (int)number_of(open, close, "utilization_gpu", 0);
        load_bus_id(gpu, open, close);
        load_health(open, close, &health[gpu_count]);
        gpu_count++;
        open = close;
    }
    free(text);
}

static gpu_t *gpu_by_index(int index) {
    for (int i = 0; i < gpu_count; i++)
        if (gpus[i].index == index) return &gpus[i];
    return NULL;
}

static void load_holder(const char *path) {
    char *text = read_file(path);
    if (!text) return; /* being replaced: like a process that just exited */
    const char *end = text + strlen(text);
    long long pid = number_of(text, end, "pid", -1);
    const char *map = value_of(text, end, "gpus");
    if (pid > 0 && pid_alive((unsigned int)pid) && map && *map == '{') {
        const char *map_end = object_end(map);
        for (const char *key = strchr(map + 1, '"'); key && map_end && key < map_end && proc_count < MAX_PROCS;) {
            int index = atoi(key + 1);
            const char *open = strchr(key, '{');
            const char *close = open ? object_end(open) : NULL;
            if (!close || close > map_end) break;
            gpu_t *gpu = gpu_by_index(index);
            if (gpu) {
                unsigned long long memory = number_of(open, close, "memory_mib", 0);
                unsigned long long room = gpu->total_mib - gpu->reserved_mib;
                gpu->used_mib = gpu->used_mib + memory > room ? room : gpu->used_mib + memory;
                if (gpu->util >= 0) {
                    gpu->util += (int)number_of(open, close, "utilization", 0);
                    if (gpu->util > 100) gpu->util = 100;
                }
                procs[proc_count].pid = (unsigned int)pid;
                procs[proc_count].gpu = index;
                procs[proc_count].memory_mib = memory;
                proc_count++;
            }
            key = strchr(close, '"');
        }
    }
    free(text);
}

static double seconds_between(struct timespec a, struct timespec b) {
    return (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
}

static void refresh(void) {
    const char *dir = fake_dir();
    struct stat info;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (stat(dir, &info) != 0) {
        gpu_count = -1;
        return;
    }
    if (gpu_count >= 0 && info.st_mtim.tv_sec == dir_mtime.tv_sec && info.st_mtim.tv_nsec == dir_mtime.tv_nsec &&
        seconds_between(loaded_at, now) < 0.2)
        return;
    dir_mtime = info.st_mtim;
    loaded_at = now;
    proc_count = 0;
    load_gpus(dir);
    if (gpu_count < 0) return;
    DIR *listing = opendir(dir);
    struct dirent *entry;
    while (listing && (entry = readdir(listing))) {
        size_t length = strlen(entry->d_name);
        if (strncmp(entry->d_name, "holder-", 7) == 0 && length > 5 && strcmp(entry->d_name + length - 5, ".json") == 0) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", dir, entry->d_name);
            load_holder(path);
        }
    }
    if (listing) closedir(listing);
}

const char *nvmlErrorString(int result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

int nvmlInit_v2(void) {
    count("nvmlInit_v2");
    const char *error = getenv("MODELWAKE_FAKE_NVML_INIT_ERROR");
    if (error && *error) return atoi(error);
    gpu_count = -1;
    refresh();
    if (gpu_count < 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    initialised++;
    return NVML_SUCCESS;
}

int nvmlShutdown(void) {
    count("nvmlShutdown");
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    initialised--;
    return NVML_SUCCESS;
}

int nvmlDeviceGetCount_v2(unsigned int *device_count) {
    count("nvmlDeviceGetCount_v2");
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!device_count) return NVML_ERROR_INVALID_ARGUMENT;
    refresh();
    *device_count = gpu_count < 0 ? 0 : (unsigned int)gpu_count;
    return NVML_SUCCESS;
}

/* A handle is the GPU's position in gpus.json, plus one (never NULL). */
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    count("nvmlDeviceGetHandleByIndex_v2");
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    refresh();
    if (!device || (int)index >= gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = (void *)(size_t)(index + 1);
    return NVML_SUCCESS;
}

static gpu_t *device_of(void *device) {
    size_t position = (size_t)device;
    refresh();
    return position >= 1 && (int)position <= gpu_count ? &gpus[position - 1] : NULL;
}

int nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory) {
    count("nvmlDeviceGetMemoryInfo");
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    gpu_t *gpu = device_of(device);
    if (!gpu || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = gpu->total_mib * MIB;
    memory->used = (gpu->used_mib + gpu->reserved_mib) * MIB;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

int nvmlDeviceGetMemoryInfo_v2(void *device, nvmlMemory_v2_t *memory) {
    count("nvmlDeviceGetMemoryInfo_v2");
    const char *v1_only = getenv("MODELWAKE_FAKE_NVML_V1_ONLY");
    if (v1_only && *v1_only == '1') return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    gpu_t *gpu = device_of(device);
    if (!gpu || !memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = gpu->total_mib * MIB;
    memory->reserved = gpu->reserved_mib * MIB;
    memory->used = gpu->used_mib * MIB;
    memory->free = memory->total - memory->reserved - memory->used;
    return NVML_SUCCESS;
}

int nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *utilization) {
    count("nvmlDeviceGetUtilizationRates");
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    gpu_t *gpu = device_of(device);
    if (!gpu || !utilization) return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu->util < 0) return NVML_ERROR_NOT_SUPPORTED;
    utilization->gpu = (unsigned int)gpu->util;
    utilization->memory = (unsigned int)gpu->util / 2;
    return NVML_SUCCESS;
}

int nvmlDeviceGetUUID(void *device, char *uuid, unsigned int length) {
    count("nvmlDeviceGetUUID");
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    gpu_t *gpu = device_of(device);
    if (!gpu || !uuid) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(gpu->uuid) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(uuid, gpu->uuid);
    return NVML_SUCCESS;
}

/* As the real call: with too small a buffer, INSUFFICIENT_SIZE and the count needed. */
int nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *info_count, nvmlProcessInfo_t *infos) {
    count("nvmlDeviceGetComputeRunningProcesses_v3");
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    gpu_t *gpu = device_of(device);
    if (!gpu || !info_count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int found = 0;
    for (int i = 0; i < proc_count; i++)
        if (procs[i].gpu == gpu->index) found++;
    if (found > *info_count || (found && !infos)) {
        *info_count = found;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    unsigned int n = 0;
    for (int i = 0; i < proc_count; i++) {
        if (procs[i].gpu != gpu->index) continue;
        infos[n].pid = procs[i].pid;
        infos[n].usedGpuMemory = procs[i].memory_mib * MIB;
        infos[n].gpuInstanceId = 0xFFFFFFFF;
        infos[n].computeInstanceId = 0xFFFFFFFF;
        n++;
    }
    *info_count = n;
    return NVML_SUCCESS;
}

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

int nvmlDeviceGetPciInfo_v3(void *device, nvmlPciInfo_t *pci) {
    count("nvmlDeviceGetPciInfo_v3");
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    gpu_t *gpu = device_of(device);
    if (!gpu || !pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    pci->domain = gpu->pci_domain;
    pci->bus = gpu->pci_bus;
    pci->device = gpu->pci_device;
    pci->pciDeviceId = 0x233510de; /* an H200's */
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", pci->domain & 0xFFFF, pci->bus, pci->device);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", pci->domain, pci->bus, pci->device);
    return NVML_SUCCESS;
}

/* The GPU health preflight's calls. */
static health_t *health_of(void *device) {
    gpu_t *gpu = device_of(device);
    return gpu ? &health[gpu - gpus] : NULL;
}

int nvmlDeviceGetPersistenceMode(void *device, int *mode) {
    count("nvmlDeviceGetPersistenceMode");
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    health_t *h = health_of(device);
    if (!h || !mode) return NVML_ERROR_INVALID_ARGUMENT;
    *mode = h->persistence;
    return NVML_SUCCESS;
}

int nvmlDeviceGetRemappedRows(void *device, unsigned int *corrRows, unsigned int *uncRows, unsigned int *isPending,
                              unsigned int *failureOccurred) {
    count("nvmlDeviceGetRemappedRows");
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    health_t *h = health_of(device);
    if (!h || !corrRows || !uncRows || !isPending || !failureOccurred) return NVML_ERROR_INVALID_ARGUMENT;
    if (!h->remap_supported) return NVML_ERROR_NOT_SUPPORTED;
    *corrRows = h->remap_correctable;
    *uncRows = h->remap_uncorrectable;
    *isPending = h->remap_pending;
    *failureOccurred = h->remap_failure;
    return NVML_SUCCESS;
}

int nvmlDeviceGetGpuFabricInfo(void *device, nvmlGpuFabricInfo_t *info) {
    count("nvmlDeviceGetGpuFabricInfo");
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    health_t *h = health_of(device);
    if (!h || !info) return NVML_ERROR_INVALID_ARGUMENT;
    if (h->fabric_state == FABRIC_NOT_SUPPORTED) return NVML_ERROR_NOT_SUPPORTED;
    memset(info, 0, sizeof *info);
    info->state = (unsigned char)h->fabric_state;
    info->status = h->fabric_status;
    return NVML_SUCCESS;
}

int nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    count("nvmlSystemGetDriverVersion");
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    refresh();
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(driver_version) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(version, driver_version);
    return NVML_SUCCESS;
}

int nvmlSystemGetCudaDriverVersion_v2(int *version) {
    count("nvmlSystemGetCudaDriverVersion_v2");
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    refresh();
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    *version = cuda_driver_version;
    return NVML_SUCCESS;
}
