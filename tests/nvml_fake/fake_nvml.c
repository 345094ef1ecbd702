/* A fake NVIDIA driver library: the NVML entry points torchherd reaches through nvidia-ml-py, scripted by a file.
 *
 * Built as libnvidia-ml.so.1 (tests/nvml_fake/__init__.py), so pynvml's own ctypes bindings load it in place
 * of the driver's. Each entry point re-reads the state file named by FAKE_NVML_STATE, so a test can change a
 * GPU between two calls (a GPU that falls off the bus mid-run). The format, one `key=value` a line:
 *
 *     driver=550.54.15           the driver version
 *     init=9                     nvmlInit's return code (9: driver not loaded); 0 or absent: success
 *     [gpu]                      starts the next GPU (index 0, 1, ...)
 *     name=NVIDIA A100-SXM4-80GB
 *     uuid=GPU-...
 *     memory_total=85899345920   bytes; memory_used likewise
 *     util_gpu=90                percent; util_memory likewise
 *     temperature=61             degrees C
 *     power=250500               milliwatts; power_limit likewise
 *     mig=0                      current MIG mode
 *     process=1234 3145728000    a compute process: pid and its GPU memory in bytes (or n/a); repeatable
 *     nvlink=1                   an NVLink to GPU 1 (P2P status OK for the NVLink index); repeatable
 *     topology=1 10              the nearest common ancestor with GPU 1 is this nvmlGpuTopologyLevel_t
 *                                (10 single switch ... 50 system, the default); repeatable
 *     fail.temperature=3         that call on this GPU returns this code (handle, name, uuid, memory,
 *                                utilization, temperature, power, power_limit, processes, mig, topology)
 *     fail=15                    every call on this GPU returns this code (15: GPU is lost)
 *
 * No FAKE_NVML_STATE, or a file that cannot be read: nvmlInit says the driver is not loaded.
 * If FAKE_NVML_LOG names a file, each call on a GPU appends "<function> <index>" to it.
 * Signatures and return codes are NVML's (nvml.h); only what is written above is scripted.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 16
#define MAX_PROCS 32
#define NVML_TOPOLOGY_SYSTEM 50
#define NVML_P2P_CAPS_INDEX_NVLINK 3
#define NVML_P2P_STATUS_OK 0
#define NVML_P2P_STATUS_NOT_SUPPORTED 5
#define TEXT 96  /* NVML_DEVICE_NAME_V2_BUFFER_SIZE, NVML_DEVICE_UUID_V2_BUFFER_SIZE */
#define NOT_AVAILABLE_ULL 0xFFFFFFFFFFFFFFFFULL  /* NVML_VALUE_NOT_AVAILABLE */
#define NOT_AVAILABLE_UINT 0xFFFFFFFFU

enum call { C_HANDLE, C_NAME, C_UUID, C_MEMORY, C_UTILIZATION, C_TEMPERATURE, C_POWER, C_POWER_LIMIT,
            C_PROCESSES, C_MIG, C_TOPOLOGY, C_CALLS };
static const char *call_names[C_CALLS] = {"handle", "name", "uuid", "memory", "utilization", "temperature",
                                          "power", "power_limit", "processes", "mig", "topology"};

struct proc { unsigned int pid; unsigned long long used; };

/* nvmlDevice_t points at one of these; it stays put when the state is re-read. */
struct nvmlDevice_st {
    char name[TEXT], uuid[TEXT];
    unsigned long long memory_total, memory_used;
    unsigned int util_gpu, util_memory, temperature, power, power_limit, mig;
    int nprocs;
    struct proc procs[MAX_PROCS];
    int fail_all;
    int fail[C_CALLS];
    int nvlink[MAX_GPUS];  /* 1: an NVLink to that GPU */
    int topology[MAX_GPUS];  /* the common ancestor's level with that GPU; 0: not given (system) */
};
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int version; int sensorType; int temperature; } nvmlTemperature_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct nvmlDevice_st gpus[MAX_GPUS];
static int ngpus;
static char driver[80];
static int init_code;
static int initialised;  /* nvmlInit calls not yet matched by nvmlShutdown */

/* Marks this library as the fake, so a test can tell it from a driver's libnvidia-ml.so.1. */
int fakeNvmlIsFake(void) { return 1; }

/* Re-read the state file; 0 when it cannot be read. */
static int load_state(void) {
    const char *path = getenv("FAKE_NVML_STATE");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (!f)
        return 0;
    memset(gpus, 0, sizeof gpus);
    ngpus = 0;
    init_code = 0;
    strcpy(driver, "550.54.15");
    struct nvmlDevice_st *g = NULL;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = 0;
        if (line[0] == '#' || line[0] == 0)
            continue;
        if (strcmp(line, "[gpu]") == 0) {
            g = ngpus < MAX_GPUS ? &gpus[ngpus++] : NULL;
            continue;
        }
        char *value = strchr(line, '=');
        if (!value)
            continue;
        *value++ = 0;
        const char *key = line;
        if (strcmp(key, "driver") == 0) snprintf(driver, sizeof driver, "%s", value);
        else if (strcmp(key, "init") == 0) init_code = atoi(value);
        else if (!g) continue;
        else if (strcmp(key, "name") == 0) snprintf(g->name, TEXT, "%s", value);
        else if (strcmp(key, "uuid") == 0) snprintf(g->uuid, TEXT, "%s", value);
        else if (strcmp(key, "memory_total") == 0) g->memory_total = strtoull(value, NULL, 10);
        else if (strcmp(key, "memory_used") == 0) g->memory_used = strtoull(value, NULL, 10);
        else if (strcmp(key, "util_gpu") == 0) g->util_gpu = strtoul(value, NULL, 10);
        else if (strcmp(key, "util_memory") == 0) g->util_memory = strtoul(value, NULL, 10);
        else if (strcmp(key, "temperature") == 0) g->temperature = strtoul(value, NULL, 10);
        else if (strcmp(key, "power") == 0) g->power = strtoul(value, NULL, 10);
        else if (strcmp(key, "power_limit") == 0) g->power_limit = strtoul(value, NULL, 10);
        else if (strcmp(key, "mig") == 0) g->mig = strtoul(value, NULL, 10);
        else if (strcmp(key, "fail") == 0) g->fail_all = atoi(value);
        else if (strcmp(key, "process") == 0 && g->nprocs < MAX_PROCS) {
            struct proc *p = &g->procs[g->nprocs];
            char used[32];
            if (sscanf(value, "%u %31s", &p->pid, used) == 2) {
                p->used = strcmp(used, "n/a") == 0 ? NOT_AVAILABLE_ULL : strtoull(used, NULL, 10);
                g->nprocs++;
            }
        } else if (strcmp(key, "nvlink") == 0) {
            int peer = atoi(value);
            if (peer >= 0 && peer < MAX_GPUS) g->nvlink[peer] = 1;
        } else if (strcmp(key, "topology") == 0) {
            int peer, level;
            if (sscanf(value, "%d %d", &peer, &level) == 2 && peer >= 0 && peer < MAX_GPUS) g->topology[peer] = level;
        } else if (strncmp(key, "fail.", 5) == 0) {
            for (int c = 0; c < C_CALLS; c++)
                if (strcmp(key + 5, call_names[c]) == 0)
                    g->fail[c] = atoi(value);
        }
    }
    fclose(f);
    return 1;
}

static void log_call(const char *function, int index) {
    const char *path = getenv("FAKE_NVML_LOG");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (f) {
        fprintf(f, "%s %d\n", function, index);
        fclose(f);
    }
}

/* The code `call` on `device` returns before any reading: uninitialised, a bad handle, or a scripted failure. */
static nvmlReturn_t enter(nvmlDevice_t device, enum call c, const char *function) {
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    load_state();
    if (device < gpus || device >= gpus + ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    log_call(function, (int)(device - gpus));
    return device->fail_all ? device->fail_all : device->fail[c];
}

/* Runs `body` under the lock when `enter` lets the call through; returns what `enter` or `body` says. */
#define DEVICE_CALL(device, c, body) do { \
        pthread_mutex_lock(&lock); \
        nvmlReturn_t ret_ = enter(device, c, __func__); \
        if (ret_ == NVML_SUCCESS) { body } \
        pthread_mutex_unlock(&lock); \
        return ret_; \
    } while (0)

static nvmlReturn_t copy_text(char *out, unsigned int length, const char *text) {
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------ library */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = load_state() ? init_code : NVML_ERROR_DRIVER_NOT_LOADED;
    if (ret == NVML_SUCCESS)
        initialised++;
    pthread_mutex_unlock(&lock);
    return ret;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = initialised ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (initialised)
        initialised--;
    pthread_mutex_unlock(&lock);
    return ret;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = initialised ? (load_state(), copy_text(version, length, driver)) : NVML_ERROR_UNINITIALIZED;
    pthread_mutex_unlock(&lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = !initialised ? NVML_ERROR_UNINITIALIZED : !count ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
    if (ret == NVML_SUCCESS) {
        load_state();
        *count = ngpus;
    }
    pthread_mutex_unlock(&lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = !initialised ? NVML_ERROR_UNINITIALIZED
        : (load_state(), !device || index >= (unsigned int)ngpus) ? NVML_ERROR_INVALID_ARGUMENT
        : enter(&gpus[index], C_HANDLE, __func__);
    if (ret == NVML_SUCCESS)
        *device = &gpus[index];
    pthread_mutex_unlock(&lock);
    return ret;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* -------------------------------------------------------------------------------------- one device */

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    DEVICE_CALL(device, C_NAME, ret_ = copy_text(name, length, device->name););
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEVICE_CALL(device, C_UUID, ret_ = copy_text(uuid, length, device->uuid););
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    DEVICE_CALL(device, C_MEMORY,
        if (!memory) {
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            memory->total = device->memory_total;
            memory->used = device->memory_used;
            memory->free = device->memory_total - device->memory_used;
        });
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    DEVICE_CALL(device, C_UTILIZATION,
        if (!utilization) {
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            utilization->gpu = device->util_gpu;
            utilization->memory = device->util_memory;
        });
}

/* Sensor 0 is NVML_TEMPERATURE_GPU, the only one there is. */
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensorType, unsigned int *temp) {
    DEVICE_CALL(device, C_TEMPERATURE,
        if (!temp || sensorType != 0)
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        else
            *temp = device->temperature;);
}

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature) {
    DEVICE_CALL(device, C_TEMPERATURE,
        if (!temperature || temperature->sensorType != 0)
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        else
            temperature->temperature = (int)device->temperature;);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    DEVICE_CALL(device, C_POWER,
        if (!power)
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        else
            *power = device->power;);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    DEVICE_CALL(device, C_POWER_LIMIT,
        if (!limit)
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        else
            *limit = device->power_limit;);
}

/* NVML's two-call protocol: too small a buffer (or none) gets the count and INSUFFICIENT_SIZE. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos) {
    DEVICE_CALL(device, C_PROCESSES,
        if (!infoCount) {
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        } else if (*infoCount < (unsigned int)device->nprocs) {
            *infoCount = device->nprocs;
            ret_ = NVML_ERROR_INSUFFICIENT_SIZE;
        } else if (device->nprocs && !infos) {
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            for (int i = 0; i < device->nprocs; i++) {
                infos[i].pid = device->procs[i].pid;
                infos[i].usedGpuMemory = device->procs[i].used;
                infos[i].gpuInstanceId = NOT_AVAILABLE_UINT;  /* MIG off */
                infos[i].computeInstanceId = NOT_AVAILABLE_UINT;
            }
            *infoCount = device->nprocs;
        });
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    DEVICE_CALL(device, C_MIG,
        if (!currentMode || !pendingMode) {
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *currentMode = device->mig;
            *pendingMode = device->mig;
        });
}

/* The topology calls: both devices must be valid; what links them is as the first one's state says. */
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2, int *pathInfo) {
    DEVICE_CALL(device1, C_TOPOLOGY,
        if (!pathInfo || device2 < gpus || device2 >= gpus + ngpus) {
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            int level = device1->topology[device2 - gpus];
            *pathInfo = level ? level : NVML_TOPOLOGY_SYSTEM;
        });
}

nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2, int p2pIndex, int *p2pStatus) {
    DEVICE_CALL(device1, C_TOPOLOGY,
        if (!p2pStatus || device2 < gpus || device2 >= gpus + ngpus) {
            ret_ = NVML_ERROR_INVALID_ARGUMENT;
        } else {
            *p2pStatus = p2pIndex == NVML_P2P_CAPS_INDEX_NVLINK && device1->nvlink[device2 - gpus]
                ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
        });
}
