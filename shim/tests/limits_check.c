/* Parses a limits file with the shim's own parser and prints what it read,
 * so pytest can compare it with fracgpu/shim_abi.py and fuzz it. */
#include <stdio.h>
#include <stdlib.h>
#include "shim.h"

int main(int argc, char **argv)
{
    static struct fracgpu_limits lim;
    char err[600];
    if (argc < 2) {
        fprintf(stderr, "usage: limits_check <file>\n");
        return 2;
    }
    if (fracgpu_limits_load(argv[1], &lim, err, sizeof err) != 0) {
        printf("error %s\n", err);
        return 1;
    }
    fracgpu_limits_apply_env(&lim, getenv(FRACGPU_ENV_MEMORY_LIMIT), getenv(FRACGPU_ENV_CORE_LIMIT));
    printf("mode %s\n", lim.whole ? "whole" : "sliced");
    printf("namespace %s\npod %s\ncontainer %s\npod_uid %s\n", lim.ns, lim.pod, lim.container,
           lim.pod_uid);
    printf("device_count %u\ncompute_limit_enabled %d\nburst_when_alone %d\npriority %d\n"
           "context_overhead_bytes %llu\nmemory_host_fallback %d\n",
           lim.device_count, lim.compute_limit_enabled, lim.burst_when_alone, lim.priority,
           (unsigned long long)lim.context_overhead, lim.memory_host_fallback);
    for (unsigned i = 0; i < lim.device_count; i++)
        printf("device %u %s %llu %u %u\n", i, lim.dev[i].uuid,
               (unsigned long long)lim.dev[i].memory_limit, lim.dev[i].core_limit,
               lim.dev[i].core_limit_max);
    return 0;
}
