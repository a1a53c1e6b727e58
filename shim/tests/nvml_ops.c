/* NVML hook test: what nvidia-smi would show for each device. */
#include <string.h>
#include "harness.h"

extern nvmlReturn_t nvmlInit_v2(void);
extern nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *);
extern nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *);
extern nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
extern nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);
extern nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t, char *, unsigned int);

int main(void)
{
    nvmlReturn_t rc = nvmlInit_v2();
    printf("init %d\n", rc);
    if (rc != NVML_SUCCESS)
        return 1;
    unsigned n = 0;
    nvmlDeviceGetCount_v2(&n);
    for (unsigned i = 0; i < n; i++) {
        nvmlDevice_t d;
        nvmlMemory_t m;
        nvmlMemory_v2_t m2;
        char uuid[96];
        nvmlDeviceGetHandleByIndex_v2(i, &d);
        nvmlDeviceGetUUID(d, uuid, sizeof uuid);
        rc = nvmlDeviceGetMemoryInfo(d, &m);
        printf("mem %u %s %d %llu %llu %llu\n", i, uuid, rc, m.total, m.used, m.free);
        memset(&m2, 0, sizeof m2);
        m2.version = NVML_MEMORY_V2_VERSION;
        rc = nvmlDeviceGetMemoryInfo_v2(d, &m2);
        printf("mem2 %u %s %d %llu %llu %llu\n", i, uuid, rc, m2.total, m2.used, m2.free);
    }
    return 0;
}
