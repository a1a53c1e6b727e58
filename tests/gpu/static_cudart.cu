// A CUDA C++ program as nvcc builds it by default: the runtime linked statically, so it
// reaches libcuda through dlopen and cuGetProcAddress rather than through any symbol the
// preload could shadow at link time. It prints what it saw, one "name value" per line.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void iota(unsigned *p, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n)
        p[i] = (unsigned)i * 3u;
}

int main() {
    size_t free_b = 0, total_b = 0;
    cudaError_t rc = cudaMemGetInfo(&free_b, &total_b);
    printf("info %d %zu\n", (int)rc, total_b);
    void *over = nullptr;
    rc = cudaMalloc(&over, total_b + 1);
    printf("over %d\n", (int)rc);
    cudaGetLastError();  // clear the sticky-free error state of the runtime
    unsigned *half = nullptr;
    rc = cudaMalloc((void **)&half, total_b / 2);
    printf("half %d\n", (int)rc);
    void *more = nullptr;
    rc = cudaMalloc(&more, total_b / 2 + (64u << 20));
    printf("more %d\n", (int)rc);
    cudaGetLastError();
    void *managed = nullptr;
    rc = cudaMallocManaged(&managed, total_b);
    printf("managed %d\n", (int)rc);
    cudaGetLastError();
    const size_t n = 1u << 24;
    iota<<<(unsigned)((n + 255) / 256), 256>>>(half, n);
    rc = cudaDeviceSynchronize();
    static unsigned host[1u << 24];
    cudaMemcpy(host, half, n * sizeof(unsigned), cudaMemcpyDeviceToHost);
    size_t right = 0;
    for (size_t i = 0; i < n; i++)
        right += host[i] == (unsigned)i * 3u;
    printf("kernel %d %zu\n", (int)rc, right);
    return 0;
}
