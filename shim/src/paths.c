/*
 * Where the limits file, the shared region and the node priority boards live.
 * Production builds use the compile-time paths only: a workload must not be
 * able to point the shim at a file of its choosing. The test build
 * (FRACGPU_TESTING) also honours three FRACGPU_TEST_* variables so that every
 * test gets its own files; nothing else differs.
 */
#include <stdlib.h>
#include "shim.h"

void fracgpu_paths(const char **limits_path, const char **region_path, const char **node_dir)
{
    *limits_path = FRACGPU_LIMITS_PATH;
    *region_path = FRACGPU_REGION_PATH;
    *node_dir = FRACGPU_NODE_DIR;
#ifdef FRACGPU_TESTING
    const char *l = getenv("FRACGPU_TEST_LIMITS_PATH");
    const char *r = getenv("FRACGPU_TEST_REGION_PATH");
    const char *n = getenv("FRACGPU_TEST_NODE_DIR");
    if (l != NULL && *l != '\0')
        *limits_path = l;
    if (r != NULL && *r != '\0')
        *region_path = r;
    if (n != NULL && *n != '\0')
        *node_dir = n;
#endif
}
