/*
 * Memory hook tests: runs a little script from argv, one line of output per
 * step ("<step> <CUresult> [values]"), so pytest can drive single processes,
 * several processes sharing a region, fork and SIGKILL.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "harness.h"

#define MAX_IDS 65536
static uint64_t ids[MAX_IDS];
static int n_ids;

static int keep(uint64_t v)
{
    ids[n_ids] = v;
    return n_ids < MAX_IDS - 1 ? n_ids++ : n_ids;
}

static uint64_t size_arg(const char *s)
{
    uint64_t v;
    if (harness_parse_size(s, &v) != 0) {
        fprintf(stderr, "bad size %s\n", s);
        exit(91);
    }
    return v;
}

struct tctx { uint64_t size; int iters; int failures; uint64_t got; int count; CUcontext ctx; };

static void *churn(void *arg)
{
    struct tctx *t = arg;
    A.cuCtxSetCurrent(t->ctx);
    for (int i = 0; i < t->iters; i++) {
        CUdeviceptr p;
        if (A.cuMemAlloc(&p, t->size) != CUDA_SUCCESS) {
            t->failures++;
            continue;
        }
        if (A.cuMemFree(p) != CUDA_SUCCESS)
            t->failures++;
    }
    return NULL;
}

static void *grab(void *arg)
{
    struct tctx *t = arg;
    A.cuCtxSetCurrent(t->ctx);
    CUdeviceptr p;
    while (A.cuMemAlloc(&p, t->size) == CUDA_SUCCESS) {
        t->got += t->size;
        t->count++;
    }
    return NULL;
}

static void run_threads(int n, void *(*fn)(void *), struct tctx *ts)
{
    pthread_t th[64];
    for (int i = 0; i < n; i++)
        pthread_create(&th[i], NULL, fn, &ts[i]);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
}

static CUcontext current_ctx(void)
{
    CUcontext c = NULL;
    extern CUresult cuCtxGetCurrent(CUcontext *);
    cuCtxGetCurrent(&c);
    return c;
}

/* The pre-11.0 cuDevicePrimaryCtxRelease/Reset, found the way this run finds functions:
 * linked, dlsym, or cuGetProcAddress with a cudaVersion below 11000. */
extern CUresult cuDevicePrimaryCtxRelease(CUdevice);
extern CUresult cuDevicePrimaryCtxReset(CUdevice);
static CUresult (*primary_v1(const char *name))(CUdevice)
{
    const char *m = harness_lookup();
    if (strcmp(m, "direct") == 0)
        return name[20] == 'l' ? cuDevicePrimaryCtxRelease : cuDevicePrimaryCtxReset;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (strcmp(m, "dlsym") == 0)
        return (CUresult(*)(CUdevice))dlsym(h, name);
    typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);
    gpa_fn gpa = (gpa_fn)dlsym(h, "cuGetProcAddress_v2");
    void *f = NULL;
    CUdriverProcAddressQueryResult st;
    gpa(name, &f, 10000, strcmp(m, "procaddr_ptds") == 0 ? 2 : 0, &st);
    return (CUresult(*)(CUdevice))f;
}

/* The pool "pool" steps allocate from: the last "mkpool", else device 0's current pool. */
static CUmemoryPool made_pool;
static CUmemoryPool pool_in_use(void)
{
    CUmemoryPool p = made_pool;
    if (p == NULL && A.cuDeviceGetMemPool(&p, 0) != CUDA_SUCCESS)
        p = NULL;
    return p;
}

/* A new graph holding one memory allocation node of bytes on device dev. */
static CUresult graph_with_alloc(int dev, uint64_t bytes, CUgraph *g, CUgraphNode *node,
                                 CUdeviceptr *dptr)
{
    CUDA_MEM_ALLOC_NODE_PARAMS np;
    memset(&np, 0, sizeof np);
    np.poolProps.allocType = 1;
    np.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    np.poolProps.location.id = dev;
    np.bytesize = bytes;
    CUresult rc = A.cuGraphCreate(g, 0);
    if (rc == CUDA_SUCCESS)
        rc = A.cuGraphAddMemAllocNode(node, *g, NULL, 0, &np);
    *dptr = np.dptr;
    return rc;
}

int main(int argc, char **argv)
{
    harness_resolve();
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        const char *c = argv[i];
        CUresult rc;
#define ARG() (i + 1 < argc ? argv[++i] : (fprintf(stderr, "missing argument\n"), exit(92), ""))
        if (strcmp(c, "ctx") == 0) {
            printf("ctx %d\n", harness_context(atoi(ARG())));
        } else if (strcmp(c, "alloc") == 0 || strcmp(c, "managed") == 0 ||
                   strcmp(c, "async") == 0 || strcmp(c, "pool") == 0) {
            uint64_t n = size_arg(ARG());
            CUdeviceptr p = 0;
            if (c[0] == 'a' && c[1] == 'l')
                rc = A.cuMemAlloc(&p, n);
            else if (c[0] == 'm')
                rc = A.cuMemAllocManaged(&p, n, 1);
            else if (c[0] == 'a')
                rc = A.cuMemAllocAsync(&p, n, NULL);
            else
                rc = A.cuMemAllocFromPoolAsync(&p, n, pool_in_use(), NULL);
            printf("%s %d %d\n", c, rc, rc == CUDA_SUCCESS ? keep(p) : -1);
        } else if (strcmp(c, "where") == 0) {
            /* where a managed allocation lives: preferred location, accessed-by list */
            CUdeviceptr p = ids[atoi(ARG())];
            int pref = CU_DEVICE_INVALID, by[4];
            rc = A.cuMemRangeGetAttribute(&pref, sizeof pref, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION,
                                          p, 1);
            if (rc == CUDA_SUCCESS)
                rc = A.cuMemRangeGetAttribute(by, sizeof by, CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, p, 1);
            if (rc == CUDA_SUCCESS)
                printf("where %d %d %d %d %d %d\n", rc, pref, by[0], by[1], by[2], by[3]);
            else
                printf("where %d\n", rc);
        } else if (strcmp(c, "advise") == 0) {
            CUdeviceptr p = ids[atoi(ARG())];
            int advice = atoi(ARG()), dev = atoi(ARG());
            printf("advise %d\n", A.cuMemAdvise(p, 1, advice, dev));
        } else if (strcmp(c, "pitch") == 0) {
            uint64_t w = size_arg(ARG()), h = size_arg(ARG());
            CUdeviceptr p = 0;
            size_t pitch = 0;
            rc = A.cuMemAllocPitch(&p, &pitch, w, h, 4);
            printf("pitch %d %d %zu\n", rc, rc == CUDA_SUCCESS ? keep(p) : -1, pitch);
        } else if (strcmp(c, "free") == 0 || strcmp(c, "freeasync") == 0) {
            int id = atoi(ARG());
            rc = c[4] == 'a' ? A.cuMemFreeAsync(ids[id], NULL) : A.cuMemFree(ids[id]);
            printf("%s %d\n", c, rc);
        } else if (strcmp(c, "kernel") == 0) {
            /* kernel <name>: one launch of that kernel (the double reads its duration and
             * local memory per thread from the name) on the null stream, then a sync */
            CUmodule m;
            CUfunction f;
            rc = A.cuModuleLoadData(&m, "fake");
            if (rc == CUDA_SUCCESS)
                rc = A.cuModuleGetFunction(&f, m, ARG());
            if (rc == CUDA_SUCCESS)
                rc = A.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
            if (rc == CUDA_SUCCESS)
                rc = A.cuCtxSynchronize();
            printf("kernel %d\n", rc);
        } else if (strcmp(c, "multikernel") == 0) {
            /* multikernel <name>: that kernel through cuLaunchCooperativeKernelMultiDevice,
             * on a new stream of the current context (one device), then a sync */
            CUmodule m;
            CUDA_LAUNCH_PARAMS lp;
            memset(&lp, 0, sizeof lp);
            lp.gridDimX = lp.gridDimY = lp.gridDimZ = 1;
            lp.blockDimX = lp.blockDimY = lp.blockDimZ = 1;
            rc = A.cuModuleLoadData(&m, "fake");
            if (rc == CUDA_SUCCESS)
                rc = A.cuModuleGetFunction(&lp.function, m, ARG());
            if (rc == CUDA_SUCCESS)
                rc = A.cuStreamCreate(&lp.hStream, 0);
            if (rc == CUDA_SUCCESS)
                rc = A.cuLaunchCooperativeKernelMultiDevice(&lp, 1, 0);
            if (rc == CUDA_SUCCESS)
                rc = A.cuCtxSynchronize();
            printf("multikernel %d\n", rc);
        } else if (strcmp(c, "gkernel") == 0) {
            /* gkernel <name>: a graph with one kernel node of that kernel (next id) */
            CUmodule m;
            CUfunction f = NULL;
            CUgraph g = NULL;
            CUgraphNode node;
            CUDA_KERNEL_NODE_PARAMS kp;
            memset(&kp, 0, sizeof kp);
            rc = A.cuModuleLoadData(&m, "fake");
            if (rc == CUDA_SUCCESS)
                rc = A.cuModuleGetFunction(&f, m, ARG());
            kp.func = f;
            kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
            kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
            if (rc == CUDA_SUCCESS)
                rc = A.cuGraphCreate(&g, 0);
            if (rc == CUDA_SUCCESS)
                rc = A.cuGraphAddKernelNode(&node, g, NULL, 0, &kp);
            printf("gkernel %d %d\n", rc, rc == CUDA_SUCCESS ? keep((uint64_t)(uintptr_t)g) : -1);
        } else if (strcmp(c, "freeon") == 0) {
            /* freeon <stream id> <id>: cuMemFreeAsync on that stream */
            CUstream st = (CUstream)(uintptr_t)ids[atoi(ARG())];
            printf("freeon %d\n", A.cuMemFreeAsync(ids[atoi(ARG())], st));
        } else if (strcmp(c, "create") == 0) {
            int dev = atoi(ARG());
            uint64_t n = size_arg(ARG());
            CUmemAllocationProp prop;
            memset(&prop, 0, sizeof prop);
            prop.type = 1;
            prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            prop.location.id = dev;
            CUmemGenericAllocationHandle h = 0;
            rc = A.cuMemCreate(&h, n, &prop, 0);
            printf("create %d %d\n", rc, rc == CUDA_SUCCESS ? keep(h) : -1);
        } else if (strcmp(c, "release") == 0) {
            printf("release %d\n", A.cuMemRelease(ids[atoi(ARG())]));
        } else if (strcmp(c, "array") == 0) {
            CUDA_ARRAY_DESCRIPTOR d = {size_arg(ARG()), size_arg(ARG()), 0x20, 4};
            CUarray a = NULL;
            rc = A.cuArrayCreate(&a, &d);
            printf("array %d %d\n", rc, rc == CUDA_SUCCESS ? keep((uint64_t)(uintptr_t)a) : -1);
        } else if (strcmp(c, "array3d") == 0) {
            CUDA_ARRAY3D_DESCRIPTOR d = {size_arg(ARG()), size_arg(ARG()), size_arg(ARG()), 0x01, 1, 0};
            CUarray a = NULL;
            rc = A.cuArray3DCreate(&a, &d);
            printf("array3d %d %d\n", rc, rc == CUDA_SUCCESS ? keep((uint64_t)(uintptr_t)a) : -1);
        } else if (strcmp(c, "mipmap") == 0) {
            CUDA_ARRAY3D_DESCRIPTOR d = {size_arg(ARG()), size_arg(ARG()), size_arg(ARG()), 0x01, 1, 0};
            unsigned levels = (unsigned)atoi(ARG());
            CUmipmappedArray a = NULL;
            rc = A.cuMipmappedArrayCreate(&a, &d, levels);
            printf("mipmap %d %d\n", rc, rc == CUDA_SUCCESS ? keep((uint64_t)(uintptr_t)a) : -1);
        } else if (strcmp(c, "adestroy") == 0) {
            printf("adestroy %d\n", A.cuArrayDestroy((CUarray)(uintptr_t)ids[atoi(ARG())]));
        } else if (strcmp(c, "mdestroy") == 0) {
            printf("mdestroy %d\n",
                   A.cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)ids[atoi(ARG())]));
        } else if (strcmp(c, "info") == 0) {
            size_t f = 0, t = 0;
            rc = A.cuMemGetInfo(&f, &t);
            printf("info %d %zu %zu\n", rc, f, t);
        } else if (strcmp(c, "total") == 0) {
            size_t t = 0;
            rc = A.cuDeviceTotalMem(&t, atoi(ARG()));
            printf("total %d %zu\n", rc, t);
        } else if (strcmp(c, "fill") == 0) {
            uint64_t n = size_arg(ARG());
            CUdeviceptr p;
            int count = 0;
            while ((rc = A.cuMemAlloc(&p, n)) == CUDA_SUCCESS) {
                keep(p);
                count++;
            }
            printf("fill %d %d\n", rc, count);
        } else if (strcmp(c, "ctxcreate") == 0) {
            CUcontext x = NULL;
            rc = A.cuCtxCreate(&x, 0, atoi(ARG()));
            printf("ctxcreate %d %d\n", rc, rc == CUDA_SUCCESS ? keep((uint64_t)(uintptr_t)x) : -1);
        } else if (strcmp(c, "ctxdestroy") == 0) {
            printf("ctxdestroy %d\n", A.cuCtxDestroy((CUcontext)(uintptr_t)ids[atoi(ARG())]));
        } else if (strcmp(c, "setctx") == 0) {
            printf("setctx %d\n", A.cuCtxSetCurrent((CUcontext)(uintptr_t)ids[atoi(ARG())]));
        } else if (strcmp(c, "primary_release") == 0) {
            printf("primary_release %d\n", A.cuDevicePrimaryCtxRelease(atoi(ARG())));
        } else if (strcmp(c, "primary_reset") == 0) {
            printf("primary_reset %d\n", A.cuDevicePrimaryCtxReset(atoi(ARG())));
        } else if (strcmp(c, "primary_release_v1") == 0 || strcmp(c, "primary_reset_v1") == 0) {
            const char *name = c[8] == 'r' && c[10] == 'l' ? "cuDevicePrimaryCtxRelease"
                                                            : "cuDevicePrimaryCtxReset";
            printf("%s %d\n", c, primary_v1(name)(atoi(ARG())));
        } else if (strcmp(c, "vreserve") == 0) {
            CUdeviceptr va = 0;
            rc = A.cuMemAddressReserve(&va, size_arg(ARG()), 0, 0, 0);
            printf("vreserve %d %d\n", rc, rc == CUDA_SUCCESS ? keep(va) : -1);
        } else if (strcmp(c, "map") == 0) {
            /* map <va id> <handle id> <size> */
            int va = atoi(ARG()), h = atoi(ARG());
            printf("map %d\n", A.cuMemMap(ids[va], size_arg(ARG()), 0, ids[h], 0));
        } else if (strcmp(c, "unmap") == 0) {
            int va = atoi(ARG());
            printf("unmap %d\n", A.cuMemUnmap(ids[va], size_arg(ARG())));
        } else if (strcmp(c, "setlimit") == 0) {
            int limit = atoi(ARG());
            printf("setlimit %d\n", A.cuCtxSetLimit(limit, size_arg(ARG())));
        } else if (strcmp(c, "threads") == 0) {
            int n = atoi(ARG()), iters = atoi(ARG());
            uint64_t sz = size_arg(ARG());
            struct tctx ts[64];
            for (int k = 0; k < n; k++)
                ts[k] = (struct tctx){sz, iters, 0, 0, 0, current_ctx()};
            run_threads(n, churn, ts);
            int fails = 0;
            for (int k = 0; k < n; k++)
                fails += ts[k].failures;
            printf("threads %d\n", fails);
        } else if (strcmp(c, "tfill") == 0) {
            int n = atoi(ARG());
            uint64_t sz = size_arg(ARG()), got = 0;
            int count = 0;
            struct tctx ts[64];
            for (int k = 0; k < n; k++)
                ts[k] = (struct tctx){sz, 0, 0, 0, 0, current_ctx()};
            run_threads(n, grab, ts);
            for (int k = 0; k < n; k++) {
                got += ts[k].got;
                count += ts[k].count;
            }
            printf("tfill %llu %d\n", (unsigned long long)got, count);
        } else if (strcmp(c, "fork") == 0) {
            uint64_t n = size_arg(ARG());
            pid_t pid = fork();
            if (pid == 0) {
                CUdeviceptr p;
                rc = A.cuMemAlloc(&p, n);
                printf("child %d\n", rc);
                fflush(stdout);
                _exit(rc == CUDA_SUCCESS ? 0 : 1);
            }
            int st = 0;
            waitpid(pid, &st, 0);
            printf("fork %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 99);
        } else if (strcmp(c, "mkpool") == 0) {
            CUmemPoolProps props;
            memset(&props, 0, sizeof props);
            props.allocType = 1;
            props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            props.location.id = atoi(ARG());
            CUmemoryPool p = NULL;
            rc = A.cuMemPoolCreate(&p, &props);
            if (rc == CUDA_SUCCESS)
                made_pool = p;
            printf("mkpool %d\n", rc);
        } else if (strcmp(c, "rmpool") == 0) {
            printf("rmpool %d\n", A.cuMemPoolDestroy(made_pool));
        } else if (strcmp(c, "threshold") == 0) {
            cuuint64_t v = size_arg(ARG());
            printf("threshold %d\n",
                   A.cuMemPoolSetAttribute(pool_in_use(), CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
        } else if (strcmp(c, "trim") == 0) {
            printf("trim %d\n", A.cuMemPoolTrimTo(pool_in_use(), size_arg(ARG())));
        } else if (strcmp(c, "sync") == 0) {
            printf("sync %d\n", A.cuCtxSynchronize());
        } else if (strcmp(c, "graph") == 0 || strcmp(c, "graphfree") == 0 ||
                   strcmp(c, "graphptr") == 0) {
            /* graph <dev> <bytes>: a graph with one memory allocation node; graphfree also
             * frees it in the graph (a free node after it), as a captured
             * cudaMallocAsync + cudaFreeAsync pair does; graphptr keeps the allocation's
             * address too (next id), for a free outside the graph */
            int with_free = strcmp(c, "graphfree") == 0;
            int with_ptr = strcmp(c, "graphptr") == 0;
            CUgraph g = NULL;
            CUgraphNode node;
            CUdeviceptr dptr = 0;
            int dev = atoi(ARG());
            rc = graph_with_alloc(dev, size_arg(ARG()), &g, &node, &dptr);
            CUgraphNode freed;
            if (rc == CUDA_SUCCESS && with_free)
                rc = A.cuGraphAddMemFreeNode(&freed, g, &node, 1, dptr);
            printf("%s %d %d", c, rc, rc == CUDA_SUCCESS ? keep((uint64_t)(uintptr_t)g) : -1);
            if (with_ptr)
                printf(" %d", rc == CUDA_SUCCESS ? keep(dptr) : -1);
            printf("\n");
        } else if (strcmp(c, "graphchild") == 0 || strcmp(c, "graphnest") == 0) {
            /* graphchild <dev> <bytes>: a graph whose only node is a child graph, moved
             * into it (12.9), that holds one memory allocation node; graphnest <dev>
             * <bytes> <depth>: that child nested depth graphs deep */
            CUgraph g = NULL;
            CUgraphNode node;
            CUdeviceptr dptr = 0;
            int dev = atoi(ARG());
            uint64_t bytes = size_arg(ARG());
            int depth = c[5] == 'n' ? atoi(ARG()) : 1;
            rc = graph_with_alloc(dev, bytes, &g, &node, &dptr);
            for (int d = 0; d < depth && rc == CUDA_SUCCESS; d++) {
                CUgraph parent = NULL;
                rc = A.cuGraphCreate(&parent, 0);
                if (rc != CUDA_SUCCESS)
                    break;
                CUgraphNodeParams gp;
                memset(&gp, 0, sizeof gp);
                gp.type = CU_GRAPH_NODE_TYPE_GRAPH;
                gp.graph.graph = g;
                gp.graph.ownership = CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE;
                rc = A.cuGraphAddNode(&node, parent, NULL, NULL, 0, &gp);
                g = parent;
            }
            printf("%s %d %d\n", c, rc, rc == CUDA_SUCCESS ? keep((uint64_t)(uintptr_t)g) : -1);
        } else if (strcmp(c, "instantiate") == 0) {
            /* instantiate <graph id> <flags> */
            CUgraph g = (CUgraph)(uintptr_t)ids[atoi(ARG())];
            CUgraphExec e = NULL;
            rc = A.cuGraphInstantiateWithFlags(&e, g, (unsigned long long)atoi(ARG()));
            printf("instantiate %d %d\n", rc,
                   rc == CUDA_SUCCESS ? keep((uint64_t)(uintptr_t)e) : -1);
        } else if (strcmp(c, "instantiatep") == 0) {
            /* instantiatep <graph id> <flags>: cuGraphInstantiateWithParams */
            CUgraph g = (CUgraph)(uintptr_t)ids[atoi(ARG())];
            CUDA_GRAPH_INSTANTIATE_PARAMS ip;
            memset(&ip, 0, sizeof ip);
            ip.flags = (cuuint64_t)atoi(ARG());
            CUgraphExec e = NULL;
            rc = A.cuGraphInstantiateWithParams(&e, g, &ip);
            printf("instantiate %d %d\n", rc,
                   rc == CUDA_SUCCESS ? keep((uint64_t)(uintptr_t)e) : -1);
        } else if (strcmp(c, "instantiate2") == 0) {
            /* instantiate2 <graph id>: the pre-12.0 cuGraphInstantiate_v2, linked */
            extern CUresult cuGraphInstantiate_v2(CUgraphExec *, CUgraph, CUgraphNode *, char *,
                                                  size_t);
            CUgraph g = (CUgraph)(uintptr_t)ids[atoi(ARG())];
            CUgraphExec e = NULL;
            char log[64];
            rc = cuGraphInstantiate_v2(&e, g, NULL, log, sizeof log);
            printf("instantiate %d %d\n", rc,
                   rc == CUDA_SUCCESS ? keep((uint64_t)(uintptr_t)e) : -1);
        } else if (strcmp(c, "stream") == 0) {
            CUstream st = NULL;
            rc = A.cuStreamCreate(&st, 0);
            printf("stream %d %d\n", rc, rc == CUDA_SUCCESS ? keep((uint64_t)(uintptr_t)st) : -1);
        } else if (strcmp(c, "capture") == 0) {
            printf("capture %d\n", A.cuStreamBeginCapture((CUstream)(uintptr_t)ids[atoi(ARG())], 0));
        } else if (strcmp(c, "endcapture") == 0) {
            CUgraph g = NULL;
            rc = A.cuStreamEndCapture((CUstream)(uintptr_t)ids[atoi(ARG())], &g);
            printf("endcapture %d %d\n", rc, rc == CUDA_SUCCESS ? keep((uint64_t)(uintptr_t)g) : -1);
        } else if (strcmp(c, "asyncon") == 0) {
            /* asyncon <stream id> <bytes>: cuMemAllocAsync on that stream */
            CUstream st = (CUstream)(uintptr_t)ids[atoi(ARG())];
            CUdeviceptr p = 0;
            rc = A.cuMemAllocAsync(&p, size_arg(ARG()), st);
            printf("asyncon %d %d\n", rc, rc == CUDA_SUCCESS ? keep(p) : -1);
        } else if (strcmp(c, "glaunch") == 0) {
            printf("glaunch %d\n", A.cuGraphLaunch((CUgraphExec)(uintptr_t)ids[atoi(ARG())], NULL));
        } else if (strcmp(c, "gupload") == 0) {
            printf("gupload %d\n", A.cuGraphUpload((CUgraphExec)(uintptr_t)ids[atoi(ARG())], NULL));
        } else if (strcmp(c, "gexecdestroy") == 0) {
            printf("gexecdestroy %d\n",
                   A.cuGraphExecDestroy((CUgraphExec)(uintptr_t)ids[atoi(ARG())]));
        } else if (strcmp(c, "gdestroy") == 0) {
            printf("gdestroy %d\n", A.cuGraphDestroy((CUgraph)(uintptr_t)ids[atoi(ARG())]));
        } else if (strcmp(c, "gtrim") == 0) {
            printf("gtrim %d\n", A.cuDeviceGraphMemTrim(atoi(ARG())));
        } else if (strcmp(c, "wait") == 0) {
            char line[64];
            printf("waiting\n");
            if (fgets(line, sizeof line, stdin) == NULL)
                return 0;
        } else if (strcmp(c, "sleep") == 0) {
            usleep((useconds_t)atoi(ARG()) * 1000);
        } else if (strcmp(c, "exec") == 0) {
            /* run the rest of the script in a fresh image with the same pid */
            fflush(stdout);
            argv[i] = argv[0];
            execv(argv[0], argv + i);
            perror("execv");
            return 94;
        } else if (strcmp(c, "kill") == 0) {
            raise(SIGKILL);
        } else {
            fprintf(stderr, "unknown step %s\n", c);
            return 93;
        }
    }
    return 0;
}
