/* RTLD_NEXT probe: an object loaded after the shim asks for the next "probe". */
#include <dlfcn.h>
char fracgpu_probe(void) { return 'a'; }
char fracgpu_probe_next_of_a(void)
{
    char (*next)(void) = (char (*)(void))dlsym(RTLD_NEXT, "fracgpu_probe");
    return next ? next() : '?';
}
