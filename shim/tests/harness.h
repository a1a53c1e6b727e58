/* Shared by the shim's C test programs: how a program finds the driver. */
#ifndef FRACGPU_TEST_HARNESS_H
#define FRACGPU_TEST_HARNESS_H
#include <stdint.h>
#include <stdio.h>
#include "fracgpu_cuda.h"

struct api {
#define API(base, sym, params) CUresult (*base) params;
#include "api.def"
};
extern struct api A;

/* FRACGPU_T_LOOKUP picks how functions are found, as real programs do:
 *   direct        linked against libcuda.so.1 (the dynamic linker)
 *   dlsym         dlopen("libcuda.so.1") + dlsym, versioned names
 *   procaddr      cuGetProcAddress_v2 as the CUDA runtime does
 *   procaddr_ptds the same with the per-thread default stream flag */
void harness_resolve(void);
const char *harness_lookup(void);
/* cuInit, retain the primary context of device dev and make it current. */
CUresult harness_context(int dev);
uint64_t harness_now_ns(void);
int harness_parse_size(const char *s, uint64_t *out);
#endif
