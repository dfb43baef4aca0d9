/*
 * fake_nvml.c: a fake libnvidia-ml.so.1 for machines without a GPU.
 *
 * Built by the tests (tests/fakelib/fakelib.py) against NVIDIA's own nvml.h (PyPI nvidia-nvml-dev),
 * so the real pynvml bindings and the real NVML backend in collectors/nvml.py run unchanged against
 * it: ctypes structures, struct versions, buffer sizes and return codes are exercised for real.
 *
 * It answers from the file named by $FAKE_NVML_SCENARIO, which fakelib.py derives from a fixture
 * machine's nvml.json (collectors/fake_nvml.py describes that format). One line per entry, fields
 * separated by tabs:
 *
 *   v KEY TYPE VALUE     a value; KEY is "GPU|FUNCTION|PATH" (GPU "-" for system calls, PATH the
 *                        call's arguments after the device joined by commas, then "/"-separated
 *                        struct fields or list indexes; a list also has PATH/n, its length);
 *                        TYPE i (integer), d (double), s (string) or e (an NVML return code)
 *   r GPU FUNCTION CODE  every matching call returns CODE (GPU or FUNCTION "*" for any)
 *   h GPU FUNCTION SECS  every matching call blocks SECS seconds first (nvmlShutdown ends the wait)
 *   x GPU TYPE DATA      an event, delivered once by nvmlEventSetWait_v2 (TYPE: nvmlEventType bits)
 *   p CODE               a plan: the Nth call of the library takes the Nth plan line's CODE (0: answer
 *                        as the scenario says), for property tests that fail any call in any order
 *
 * A value the file lacks answers NVML_ERROR_NOT_SUPPORTED, as the driver does for a fact the GPU
 * lacks. A function the scenario says an older driver lacks (FunctionNotFound for every GPU) is not
 * exported at all: fakelib.py links that build with a version script that hides the symbol.
 * Every nvmlInitWithFlags reads the file again, so one process can go through many scenarios.
 */
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_GPUS 64
#define MAX_MIGS 8
#define MAX_LINE 4096

struct nvmlDevice_st { unsigned int index; };
struct nvmlEventSet_st { int unused; };

typedef struct { char *key; char type; char *text; } entry_t;
typedef struct { int gpu; char *fn; int code; double seconds; } rule_t;   /* gpu -1: any */
typedef struct { unsigned int gpu; unsigned long long type, data; } event_t;

static entry_t *entries;
static size_t n_entries, cap_entries;
static rule_t *rules;
static size_t n_rules, cap_rules;
static event_t *events;
static size_t n_events, cap_events, next_event;
static int *plan;
static size_t n_plan, cap_plan, next_plan;
static struct nvmlDevice_st devices[MAX_GPUS];
static struct nvmlDevice_st mig_devices[MAX_GPUS][MAX_MIGS];  /* a MIG device's handle: its GPU and slot */
static struct nvmlEventSet_st the_event_set;
static int initialized;
static volatile int shutting_down;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int by_key(const void *a, const void *b) {
    return strcmp(((const entry_t *)a)->key, ((const entry_t *)b)->key);
}

/* Room for one more element in a growing array (the capacity doubles, so loading stays linear). */
static void *grow(void *array, size_t count, size_t *capacity, size_t size) {
    if (count < *capacity) return array;
    *capacity = *capacity ? *capacity * 2 : 64;
    void *bigger = realloc(array, *capacity * size);
    if (!bigger) abort();
    return bigger;
}

/* Read a scenario afresh. The old arrays are left allocated: a thread abandoned in a blocked call may
 * still hold them (a test library; the leak is a few kilobytes per scenario). */
static int load(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    entries = NULL, rules = NULL, events = NULL, plan = NULL;
    n_entries = cap_entries = n_rules = cap_rules = n_events = cap_events = next_event = 0;
    n_plan = cap_plan = next_plan = 0;
    char line[MAX_LINE];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *save, *kind = strtok_r(line, "\t", &save);
        char *a = strtok_r(NULL, "\t", &save), *b = strtok_r(NULL, "\t", &save), *c = strtok_r(NULL, "", &save);
        if (!kind || !a || (!b && kind[0] != 'p')) continue;
        if (kind[0] == 'v') {
            entries = grow(entries, n_entries, &cap_entries, sizeof *entries);
            entries[n_entries].key = strdup(a);
            entries[n_entries].type = b[0];
            entries[n_entries].text = strdup(c ? c : "");
            n_entries++;
        } else if ((kind[0] == 'r' || kind[0] == 'h') && c) {
            rules = grow(rules, n_rules, &cap_rules, sizeof *rules);
            rules[n_rules].gpu = strcmp(a, "*") == 0 ? -1 : atoi(a);
            rules[n_rules].fn = strdup(b);
            rules[n_rules].code = kind[0] == 'r' ? atoi(c) : NVML_SUCCESS;
            rules[n_rules].seconds = kind[0] == 'h' ? atof(c) : 0;
            n_rules++;
        } else if (kind[0] == 'x' && c) {
            events = grow(events, n_events, &cap_events, sizeof *events);
            events[n_events].gpu = (unsigned int)atoi(a);
            events[n_events].type = strtoull(b, NULL, 0);
            events[n_events].data = strtoull(c, NULL, 0);
            n_events++;
        } else if (kind[0] == 'p') {
            plan = grow(plan, n_plan, &cap_plan, sizeof *plan);
            plan[n_plan++] = atoi(a);
        }
    }
    fclose(f);
    qsort(entries, n_entries, sizeof *entries, by_key);
    return 0;
}

/* Sleep up to `seconds`, in short steps so that nvmlShutdown ends the wait. */
static void pause_for(double seconds) {
    struct timespec step = {0, 10 * 1000 * 1000};
    for (double waited = 0; waited < seconds && !shutting_down; waited += 0.01) nanosleep(&step, NULL);
}

/* The scripted trouble of one call: the plan's next code, else block if a hang rule matches (a call
 * still blocked at nvmlShutdown answers Uninitialized), then the first error rule's code. */
static nvmlReturn_t trouble(int gpu, const char *fn) {
    if (!initialized || shutting_down) return NVML_ERROR_UNINITIALIZED;
    if (n_plan) {
        pthread_mutex_lock(&lock);
        int code = next_plan < n_plan ? plan[next_plan++] : 0;
        pthread_mutex_unlock(&lock);
        if (code) return (nvmlReturn_t)code;
    }
    for (size_t i = 0; i < n_rules; i++)
        if (rules[i].seconds > 0 && (rules[i].gpu == -1 || rules[i].gpu == gpu) &&
            (strcmp(rules[i].fn, "*") == 0 || strcmp(rules[i].fn, fn) == 0)) {
            pause_for(rules[i].seconds);
            if (shutting_down) return NVML_ERROR_UNINITIALIZED;
            break;
        }
    for (size_t i = 0; i < n_rules; i++)
        if (rules[i].seconds == 0 && (rules[i].gpu == -1 || rules[i].gpu == gpu) &&
            (strcmp(rules[i].fn, "*") == 0 || strcmp(rules[i].fn, fn) == 0))
            return (nvmlReturn_t)rules[i].code;
    return NVML_SUCCESS;
}

static const entry_t *find(int gpu, const char *fn, const char *path) {
    char key[512];
    if (gpu < 0) snprintf(key, sizeof key, "-|%s|%s", fn, path);
    else snprintf(key, sizeof key, "%d|%s|%s", gpu, fn, path);
    entry_t probe = {key, 0, NULL};
    return bsearch(&probe, entries, n_entries, sizeof *entries, by_key);
}

/* An integer value, or the NVML return code that stands for it. */
static nvmlReturn_t integer(int gpu, const char *fn, const char *path, long long *out) {
    const entry_t *e = find(gpu, fn, path);
    if (!e) return NVML_ERROR_NOT_SUPPORTED;
    if (e->type == 'e') return (nvmlReturn_t)atoi(e->text);
    if (e->type != 'i') return NVML_ERROR_UNKNOWN;
    *out = strtoll(e->text, NULL, 10);
    return NVML_SUCCESS;
}

static nvmlReturn_t text(int gpu, const char *fn, const char *path, char *out, unsigned int length) {
    const entry_t *e = find(gpu, fn, path);
    if (!e) return NVML_ERROR_NOT_SUPPORTED;
    if (e->type == 'e') return (nvmlReturn_t)atoi(e->text);
    if (e->type != 's') return NVML_ERROR_UNKNOWN;
    if (!out || strlen(e->text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, e->text, strlen(e->text) + 1);
    return NVML_SUCCESS;
}

static int device_index(nvmlDevice_t device) {
    if (device < devices || device >= devices + MAX_GPUS) return -1;
    return (int)(device - devices);
}

/* A MIG device handle's GPU (and slot in *slot), or -1 for any other handle. */
static int mig_gpu(nvmlDevice_t device, unsigned int *slot) {
    struct nvmlDevice_st *first = &mig_devices[0][0];
    if (device < first || device >= first + MAX_GPUS * MAX_MIGS) return -1;
    *slot = (unsigned int)(device - first) % MAX_MIGS;
    return (int)((device - first) / MAX_MIGS);
}

/* The calls on a MIG device handle answer from its slot under nvmlDeviceGetMigDeviceHandleByIndex, with that
 * call's scripted trouble: to the Python fake the whole MIG device is that one call. */
#define MIG_HANDLE "nvmlDeviceGetMigDeviceHandleByIndex"

/* The device's index after its scripted trouble, or a negative NVML return code. */
#define DEVICE(fn)                                                  \
    int gpu = device_index(device);                                 \
    if (gpu < 0) return NVML_ERROR_INVALID_ARGUMENT;                \
    nvmlReturn_t trouble_ = trouble(gpu, fn);                       \
    if (trouble_ != NVML_SUCCESS) return trouble_;

/* ---- library ------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&lock);
    nvmlReturn_t ret = NVML_SUCCESS;
    const char *path = getenv("FAKE_NVML_SCENARIO");
    if (!path || load(path) != 0) ret = NVML_ERROR_DRIVER_NOT_LOADED;
    initialized = ret == NVML_SUCCESS;
    shutting_down = 0;
    pthread_mutex_unlock(&lock);
    if (ret == NVML_SUCCESS) {
        for (size_t i = 0; i < n_rules; i++)  /* the Python fake's nvmlInit: only rules for any GPU */
            if (rules[i].seconds == 0 && rules[i].gpu == -1 &&
                (strcmp(rules[i].fn, "*") == 0 || strcmp(rules[i].fn, "nvmlInit") == 0))
                return (nvmlReturn_t)rules[i].code;
    }
    return ret;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    shutting_down = 1;  /* ends any blocked call or event wait; the scenario stays loaded */
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    static char text_[32];
    snprintf(text_, sizeof text_, "fake NVML error %d", (int)result);
    return text_;
}

/* ---- system ------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    nvmlReturn_t r = trouble(-1, "nvmlSystemGetDriverVersion");
    return r != NVML_SUCCESS ? r : text(-1, "nvmlSystemGetDriverVersion", "", version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    long long v;
    nvmlReturn_t r = trouble(-1, "nvmlSystemGetCudaDriverVersion");
    if (r == NVML_SUCCESS) r = integer(-1, "nvmlSystemGetCudaDriverVersion", "", &v);
    if (r == NVML_SUCCESS) *version = (int)v;
    return r;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    long long v;
    nvmlReturn_t r = trouble(-1, "nvmlDeviceGetCount");
    if (r == NVML_SUCCESS) r = integer(-1, "nvmlDeviceGetCount", "", &v);
    if (r == NVML_SUCCESS) *count = (unsigned int)v;
    return r;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    long long count = 0;
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (integer(-1, "nvmlDeviceGetCount", "", &count) != NVML_SUCCESS || index >= count || index >= MAX_GPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    devices[index].index = index;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) {
    int gpu = device_index(device);
    if (gpu < 0) return NVML_ERROR_INVALID_ARGUMENT;
    *index = (unsigned int)gpu;
    return NVML_SUCCESS;
}

/* ---- per device: the simple shapes ------------------------------------------------------------ */

#define TEXT_CALL(fn)                                                                   \
    nvmlReturn_t fn(nvmlDevice_t device, char *out, unsigned int length) {              \
        DEVICE(#fn)                                                                     \
        return text(gpu, #fn, "", out, length);                                         \
    }
TEXT_CALL(nvmlDeviceGetName)
TEXT_CALL(nvmlDeviceGetSerial)
TEXT_CALL(nvmlDeviceGetVbiosVersion)

/* One integer answer of type T, at the scenario path `path`. */
#define NUMBER_CALL(fn, T)                                                              \
    nvmlReturn_t fn(nvmlDevice_t device, T *out) {                                      \
        DEVICE(#fn)                                                                     \
        long long v;                                                                    \
        nvmlReturn_t r = integer(gpu, #fn, "", &v);                                     \
        if (r == NVML_SUCCESS) *out = (T)v;                                             \
        return r;                                                                       \
    }
NUMBER_CALL(nvmlDeviceGetArchitecture, nvmlDeviceArchitecture_t)
NUMBER_CALL(nvmlDeviceGetPersistenceMode, nvmlEnableState_t)
NUMBER_CALL(nvmlDeviceGetRetiredPagesPendingStatus, nvmlEnableState_t)
NUMBER_CALL(nvmlDeviceGetCurrPcieLinkGeneration, unsigned int)
NUMBER_CALL(nvmlDeviceGetCurrPcieLinkWidth, unsigned int)
NUMBER_CALL(nvmlDeviceGetMaxPcieLinkGeneration, unsigned int)
NUMBER_CALL(nvmlDeviceGetMaxPcieLinkWidth, unsigned int)
NUMBER_CALL(nvmlDeviceGetPcieReplayCounter, unsigned int)
NUMBER_CALL(nvmlDeviceGetCurrentClocksEventReasons, unsigned long long)
NUMBER_CALL(nvmlDeviceGetCurrentClocksThrottleReasons, unsigned long long)
NUMBER_CALL(nvmlDeviceGetPowerUsage, unsigned int)
NUMBER_CALL(nvmlDeviceGetEnforcedPowerLimit, unsigned int)
NUMBER_CALL(nvmlDeviceGetMaxMigDeviceCount, unsigned int)

/* ---- MIG devices ------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    DEVICE(MIG_HANDLE)
    char path[32], uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (index >= MAX_MIGS) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(path, sizeof path, "%u", index);
    const entry_t *e = find(gpu, MIG_HANDLE, path);  /* {"error": ...}: an empty slot, or trouble */
    if (e && e->type == 'e') return (nvmlReturn_t)atoi(e->text);
    snprintf(path, sizeof path, "%u/uuid", index);
    nvmlReturn_t r = text(gpu, MIG_HANDLE, path, uuid, sizeof uuid);
    if (r != NVML_SUCCESS) return r;
    mig_devices[gpu][index].index = (unsigned int)gpu;
    *migDevice = &mig_devices[gpu][index];
    return NVML_SUCCESS;
}

static nvmlReturn_t gpu_uuid(nvmlDevice_t device, char *uuid, unsigned int length) {
    DEVICE("nvmlDeviceGetUUID")
    return text(gpu, "nvmlDeviceGetUUID", "", uuid, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    unsigned int slot;
    char path[32];
    int mig = mig_gpu(device, &slot);
    if (mig < 0) return gpu_uuid(device, uuid, length);
    nvmlReturn_t r = trouble(mig, MIG_HANDLE);
    if (r != NVML_SUCCESS) return r;
    snprintf(path, sizeof path, "%u/uuid", slot);
    return text(mig, MIG_HANDLE, path, uuid, length);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    unsigned int slot;
    char path[32];
    long long v;
    int gpu = mig_gpu(device, &slot);
    if (gpu < 0) return NVML_ERROR_NOT_SUPPORTED;  /* a GPU, not a MIG device */
    nvmlReturn_t r = trouble(gpu, MIG_HANDLE);
    if (r != NVML_SUCCESS) return r;
    snprintf(path, sizeof path, "%u/gpuInstanceId", slot);
    r = integer(gpu, MIG_HANDLE, path, &v);
    if (r == NVML_SUCCESS) *id = (unsigned int)v;
    return r;
}

/* Several integers of one call (a list or a struct in the scenario), each at its own path. */
static nvmlReturn_t several(int gpu, const char *fn, const char *args, const char *const *fields,
                            unsigned long long *out, int n) {
    char path[256];
    long long v;
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s%s%s", args, *args ? "/" : "", fields[i]);
        nvmlReturn_t r = integer(gpu, fn, path, &v);
        if (r != NVML_SUCCESS) return r;
        out[i] = (unsigned long long)v;
    }
    return NVML_SUCCESS;
}

static const char *const INDEXES[] = {"0", "1", "2", "3"};

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current, unsigned int *pending) {
    DEVICE("nvmlDeviceGetMigMode")
    unsigned long long v[2];
    nvmlReturn_t r = several(gpu, "nvmlDeviceGetMigMode", "", INDEXES, v, 2);
    if (r == NVML_SUCCESS) *current = (unsigned int)v[0], *pending = (unsigned int)v[1];
    return r;
}

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending) {
    DEVICE("nvmlDeviceGetEccMode")
    unsigned long long v[2];
    nvmlReturn_t r = several(gpu, "nvmlDeviceGetEccMode", "", INDEXES, v, 2);
    if (r == NVML_SUCCESS) *current = (nvmlEnableState_t)v[0], *pending = (nvmlEnableState_t)v[1];
    return r;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                       unsigned int *isPending, unsigned int *failureOccurred) {
    DEVICE("nvmlDeviceGetRemappedRows")
    unsigned long long v[4];
    nvmlReturn_t r = several(gpu, "nvmlDeviceGetRemappedRows", "", INDEXES, v, 4);
    if (r == NVML_SUCCESS) {
        *corrRows = (unsigned int)v[0], *uncRows = (unsigned int)v[1];
        *isPending = (unsigned int)v[2], *failureOccurred = (unsigned int)v[3];
    }
    return r;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    DEVICE("nvmlDeviceGetUtilizationRates")
    static const char *const fields[] = {"gpu", "memory"};
    unsigned long long v[2];
    nvmlReturn_t r = several(gpu, "nvmlDeviceGetUtilizationRates", "", fields, v, 2);
    if (r == NVML_SUCCESS) utilization->gpu = (unsigned int)v[0], utilization->memory = (unsigned int)v[1];
    return r;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info) {
    DEVICE("nvmlDeviceGetGpuFabricInfo")
    static const char *const fields[] = {"state", "status"};
    unsigned long long v[2];
    nvmlReturn_t r = several(gpu, "nvmlDeviceGetGpuFabricInfo", "", fields, v, 2);
    if (r == NVML_SUCCESS) {
        memset(info, 0, sizeof *info);
        info->state = (nvmlGpuFabricState_t)v[0];
        info->status = (nvmlReturn_t)v[1];
    }
    return r;
}

/* A PCI info struct from a scenario's {"busId": ..., "pciDeviceId": ...} at `args`. */
static nvmlReturn_t pci_info(int gpu, const char *fn, const char *args, nvmlPciInfo_t *pci) {
    char path[256];
    long long id = 0;
    memset(pci, 0, sizeof *pci);
    snprintf(path, sizeof path, "%s%sbusId", args, *args ? "/" : "");
    nvmlReturn_t r = text(gpu, fn, path, pci->busId, sizeof pci->busId);
    if (r != NVML_SUCCESS) return r;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%s", pci->busId + (strlen(pci->busId) > 12 ? 4 : 0));
    unsigned int domain = 0, bus = 0, dev = 0;
    if (sscanf(pci->busId, "%x:%x:%x", &domain, &bus, &dev) == 3)
        pci->domain = domain, pci->bus = bus, pci->device = dev;
    snprintf(path, sizeof path, "%s%spciDeviceId", args, *args ? "/" : "");
    if (integer(gpu, fn, path, &id) == NVML_SUCCESS) pci->pciDeviceId = (unsigned int)id;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    DEVICE("nvmlDeviceGetPciInfo")
    return pci_info(gpu, "nvmlDeviceGetPciInfo", "", pci);
}

/* ---- per device: calls with arguments ------------------------------------------------------------ */

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType, unsigned long long *eccCounts) {
    DEVICE("nvmlDeviceGetTotalEccErrors")
    char args[32];
    long long v;
    snprintf(args, sizeof args, "%d,%d", (int)errorType, (int)counterType);
    nvmlReturn_t r = integer(gpu, "nvmlDeviceGetTotalEccErrors", args, &v);
    if (r == NVML_SUCCESS) *eccCounts = (unsigned long long)v;
    return r;
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                       unsigned int *pageCount, unsigned long long *addresses) {
    DEVICE("nvmlDeviceGetRetiredPages")
    char path[64];
    long long n, address;
    snprintf(path, sizeof path, "%d/n", (int)cause);
    nvmlReturn_t r = integer(gpu, "nvmlDeviceGetRetiredPages", path, &n);
    if (r != NVML_SUCCESS) return r;
    if (addresses == NULL || *pageCount < n) {  /* the driver's two-call protocol: first the size */
        *pageCount = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (long long i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%d/%lld", (int)cause, i);
        r = integer(gpu, "nvmlDeviceGetRetiredPages", path, &address);
        if (r != NVML_SUCCESS) return r;
        addresses[i] = (unsigned long long)address;
    }
    *pageCount = (unsigned int)n;
    return NVML_SUCCESS;
}

#define LINK_CALL(fn, T)                                                                \
    nvmlReturn_t fn(nvmlDevice_t device, unsigned int link, T *out) {                   \
        DEVICE(#fn)                                                                     \
        char args[16];                                                                  \
        long long v;                                                                    \
        snprintf(args, sizeof args, "%u", link);                                        \
        nvmlReturn_t r = integer(gpu, #fn, args, &v);                                   \
        if (r == NVML_SUCCESS) *out = (T)v;                                             \
        return r;                                                                       \
    }
LINK_CALL(nvmlDeviceGetNvLinkState, nvmlEnableState_t)
LINK_CALL(nvmlDeviceGetNvLinkVersion, unsigned int)

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    DEVICE("nvmlDeviceGetNvLinkRemotePciInfo")
    char args[16];
    snprintf(args, sizeof args, "%u", link);
    return pci_info(gpu, "nvmlDeviceGetNvLinkRemotePciInfo", args, pci);
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link, nvmlNvLinkErrorCounter_t counter,
                                             unsigned long long *counterValue) {
    DEVICE("nvmlDeviceGetNvLinkErrorCounter")
    char args[32];
    long long v;
    snprintf(args, sizeof args, "%u,%d", link, (int)counter);
    nvmlReturn_t r = integer(gpu, "nvmlDeviceGetNvLinkErrorCounter", args, &v);
    if (r == NVML_SUCCESS) *counterValue = (unsigned long long)v;
    return r;
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter, unsigned int *value) {
    DEVICE("nvmlDeviceGetPcieThroughput")
    char args[16];
    long long v;
    snprintf(args, sizeof args, "%d", (int)counter);
    nvmlReturn_t r = integer(gpu, "nvmlDeviceGetPcieThroughput", args, &v);
    if (r == NVML_SUCCESS) *value = (unsigned int)v;
    return r;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp) {
    DEVICE("nvmlDeviceGetTemperature")
    char args[16];
    long long v;
    snprintf(args, sizeof args, "%d", (int)sensorType);
    nvmlReturn_t r = integer(gpu, "nvmlDeviceGetTemperature", args, &v);
    if (r == NVML_SUCCESS) *temp = (unsigned int)v;
    return r;
}

/* Each field answers on its own (its nvmlReturn), as the driver does; the call fails only as a whole. */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values) {
    DEVICE("nvmlDeviceGetFieldValues")
    if (valuesCount < 0 || (valuesCount > 0 && values == NULL)) return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *fv = &values[i];
        char args[32];
        snprintf(args, sizeof args, "%u,%u", fv->fieldId, fv->scopeId);
        fv->timestamp = (long long)now.tv_sec * 1000000 + now.tv_nsec / 1000;
        fv->latencyUsec = 0;
        const entry_t *e = find(gpu, "nvmlDeviceGetFieldValues", args);
        memset(&fv->value, 0, sizeof fv->value);
        if (!e) {
            fv->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        } else if (e->type == 'e') {
            fv->nvmlReturn = (nvmlReturn_t)atoi(e->text);
        } else if (e->type == 'd') {
            fv->nvmlReturn = NVML_SUCCESS;
            fv->valueType = NVML_VALUE_TYPE_DOUBLE;
            fv->value.dVal = strtod(e->text, NULL);
        } else if (e->type == 'i') {
            fv->nvmlReturn = NVML_SUCCESS;
            long long v = strtoll(e->text, NULL, 10);
            fv->valueType = v < 0 ? NVML_VALUE_TYPE_SIGNED_LONG_LONG : NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            if (v < 0) fv->value.sllVal = v;
            else fv->value.ullVal = (unsigned long long)v;
        } else {
            fv->nvmlReturn = NVML_ERROR_UNKNOWN;
        }
    }
    return NVML_SUCCESS;
}

/* ---- events --------------------------------------------------------------------------------------- */

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    nvmlReturn_t r = trouble(-1, "nvmlEventSetCreate");
    if (r == NVML_SUCCESS) *set = &the_event_set;
    return r;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    DEVICE("nvmlDeviceRegisterEvents")
    (void)eventTypes;
    return set == &the_event_set ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    return set == &the_event_set ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

/* The scenario's events one per call, then nothing: wait out the timeout like the driver. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    if (set != &the_event_set) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = trouble(-1, "nvmlEventSetWait");
    if (r != NVML_SUCCESS) return r;
    pthread_mutex_lock(&lock);
    size_t mine = next_event < n_events ? next_event++ : n_events;
    pthread_mutex_unlock(&lock);
    if (mine < n_events) {
        memset(data, 0, sizeof *data);
        data->device = &devices[events[mine].gpu % MAX_GPUS];
        data->device->index = events[mine].gpu % MAX_GPUS;
        data->eventType = events[mine].type;
        data->eventData = events[mine].data;
        data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
        return NVML_SUCCESS;
    }
    pause_for(timeoutms / 1000.0);
    return NVML_ERROR_TIMEOUT;
}
