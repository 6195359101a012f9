// The CUDA runtime side: errors, devices, streams and events, the allocator, copies.
//
// Allocator: stream-ordered (cudaMallocAsync / cudaFreeAsync on the current stream) from each
// device's default memory pool, whose release threshold is raised to "never" so that freed
// blocks stay cached for the next step instead of going back to the driver, the way the CPU
// allocator caches. Statistics count what tensors hold (allocated) and what the pool holds
// (reserved). A block freed on one stream and still read by another must be kept alive by
// its user until that stream is done (the NCCL process group waits on an event first).
#include <mutex>
#include <stdarg.h>
#include <string.h>

#include "common.cuh"

static constexpr int kMaxDevices = 64;

// ---- errors ---------------------------------------------------------------------------
static thread_local char error_message[1024] = "";

it_status it_cuda_error(it_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_message, sizeof error_message, fmt, ap);
    va_end(ap);
    return status;
}

extern "C" const char *it_cuda_last_error(void) { return error_message; }

// ---- deferred index errors ----------------------------------------------------------------
__device__ int index_error;  // one per device (each device's module has its own)

it_status it_cuda_index_flag(it_device device, int **flag) {
    CU_TRY(cudaGetSymbolAddress((void **)flag, index_error));
    return IT_OK;
}

// Called after the host has synchronised with the device's work.
it_status it_cuda_check_index_flag(it_device device) {
    int seen = 0, zero = 0;
    CU_TRY(cudaMemcpyFromSymbol(&seen, index_error, sizeof seen));
    if (!seen) return IT_OK;
    CU_TRY(cudaMemcpyToSymbol(index_error, &zero, sizeof zero));
    return it_cuda_error(IT_ERR_INDEX_OUT_OF_RANGE, "a kernel queued earlier on cuda:%d met an input "
                         "outside its range: an embedding id >= the table's rows or negative, a "
                         "cross-entropy target outside the vocabulary that is not ignore_index, an "
                         "index outside its axis, or multinomial weights that are negative, not finite "
                         "or all zero; the results since the last synchronisation are invalid",
                         (int)device.index);
}

// ---- devices --------------------------------------------------------------------------
static int device_count_cached = -1;
static cudaError_t device_count_error = cudaSuccess;
static std::once_flag count_once;

static int count_devices() {
    std::call_once(count_once, [] {
        int n = 0;
        device_count_error = cudaGetDeviceCount(&n);  // no driver: an error, and no device
        if (device_count_error != cudaSuccess) {
            cudaGetLastError();
            n = 0;
        }
        device_count_cached = n < kMaxDevices ? n : kMaxDevices;
    });
    return device_count_cached;
}

extern "C" it_status it_cuda_device_count(int32_t *count) {
    *count = count_devices();
    return IT_OK;
}

it_status it_cuda_use(it_device device) {
    int n = count_devices();
    if (n == 0)
        return it_cuda_error(IT_ERR_NO_CUDA, "no CUDA device (cuda:%d was asked for): %s",
                             (int)device.index,
                             device_count_error != cudaSuccess ? cudaGetErrorString(device_count_error)
                                                               : "the driver reports none");
    if (device.index >= n)
        return it_cuda_error(IT_ERR_INVALID_ARGUMENT, "cuda:%d does not exist: this machine has %d "
                             "CUDA device(s), cuda:0 to cuda:%d", (int)device.index, n, n - 1);
    CU_TRY(cudaSetDevice(device.index));
    return IT_OK;
}

extern "C" it_status it_cuda_device_synchronize(it_device device) {
    IT_CU_TRY(it_cuda_use(device));
    CU_TRY(cudaDeviceSynchronize());
    return it_cuda_check_index_flag(device);
}

// ---- streams ----------------------------------------------------------------------------
static cudaStream_t own_stream[kMaxDevices];
static std::mutex own_stream_lock;
static thread_local cudaStream_t current_stream[kMaxDevices];  // NULL: the device's own

static cudaStream_t device_stream(int index) {
    std::lock_guard<std::mutex> guard(own_stream_lock);
    if (!own_stream[index]) {
        // non-blocking: it never waits on the legacy default stream that other libraries use
        if (cudaStreamCreateWithFlags(&own_stream[index], cudaStreamNonBlocking) != cudaSuccess) {
            cudaGetLastError();
            own_stream[index] = 0;  // fall back to the default stream
        }
    }
    return own_stream[index];
}

cudaStream_t it_cuda_stream(it_device device) {
    cudaStream_t s = current_stream[device.index];
    return s ? s : device_stream(device.index);
}

extern "C" it_status it_cuda_stream_create(it_device device, void **out) {
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s;
    CU_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = (void *)s;
    return IT_OK;
}

extern "C" it_status it_cuda_stream_destroy(it_device device, void *stream) {
    IT_CU_TRY(it_cuda_use(device));
    if (current_stream[device.index] == (cudaStream_t)stream) current_stream[device.index] = 0;
    CU_TRY(cudaStreamDestroy((cudaStream_t)stream));
    return IT_OK;
}

extern "C" it_status it_cuda_stream_synchronize(it_device device, void *stream) {
    IT_CU_TRY(it_cuda_use(device));
    CU_TRY(cudaStreamSynchronize(stream ? (cudaStream_t)stream : it_cuda_stream(device)));
    return it_cuda_check_index_flag(device);
}

extern "C" it_status it_cuda_set_stream(it_device device, void *stream) {
    IT_CU_TRY(it_cuda_use(device));
    current_stream[device.index] = (cudaStream_t)stream;
    return IT_OK;
}

// ---- events -------------------------------------------------------------------------------
extern "C" it_status it_cuda_event_create(it_device device, void **out) {
    IT_CU_TRY(it_cuda_use(device));
    cudaEvent_t e;
    CU_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *out = (void *)e;
    return IT_OK;
}

extern "C" it_status it_cuda_event_create_timing(it_device device, void **out) {
    IT_CU_TRY(it_cuda_use(device));
    cudaEvent_t e;
    CU_TRY(cudaEventCreateWithFlags(&e, 0));  // the default flags: timing on
    *out = (void *)e;
    return IT_OK;
}

extern "C" it_status it_cuda_event_elapsed_time(it_device device, void *start, void *end, float *ms) {
    IT_CU_TRY(it_cuda_use(device));
    CU_TRY(cudaEventSynchronize((cudaEvent_t)end));
#ifdef __CUDACC__
    CU_TRY(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end));
#else  // the emulated GPU (g++, tests/cuda/cuda_emulator) has no clock: its work takes no time
    (void)start;
    *ms = 0.0f;
#endif
    return IT_OK;
}

extern "C" it_status it_cuda_event_destroy(it_device device, void *event) {
    IT_CU_TRY(it_cuda_use(device));
    CU_TRY(cudaEventDestroy((cudaEvent_t)event));
    return IT_OK;
}

extern "C" it_status it_cuda_event_record(it_device device, void *event, void *stream) {
    IT_CU_TRY(it_cuda_use(device));
    CU_TRY(cudaEventRecord((cudaEvent_t)event, stream ? (cudaStream_t)stream : it_cuda_stream(device)));
    return IT_OK;
}

extern "C" it_status it_cuda_stream_wait_event(it_device device, void *stream, void *event) {
    IT_CU_TRY(it_cuda_use(device));
    CU_TRY(cudaStreamWaitEvent(stream ? (cudaStream_t)stream : it_cuda_stream(device),
                               (cudaEvent_t)event, 0));
    return IT_OK;
}

extern "C" it_status it_cuda_event_synchronize(it_device device, void *event) {
    IT_CU_TRY(it_cuda_use(device));
    CU_TRY(cudaEventSynchronize((cudaEvent_t)event));
    return IT_OK;
}

extern "C" it_status it_cuda_event_query(it_device device, void *event, int32_t *done) {
    IT_CU_TRY(it_cuda_use(device));
    cudaError_t e = cudaEventQuery((cudaEvent_t)event);
    if (e == cudaErrorNotReady) {
        cudaGetLastError();
        *done = 0;
        return IT_OK;
    }
    CU_TRY(e);
    *done = 1;
    return IT_OK;
}

// ---- the allocator --------------------------------------------------------------------------
struct DeviceMemory {
    std::mutex lock;
    bool pool_ready = false;
    it_memory_stats stats = {};
};
static DeviceMemory memory[kMaxDevices];

static it_status ready_pool(int index) {
    DeviceMemory &m = memory[index];
    if (m.pool_ready) return IT_OK;
    cudaMemPool_t pool;
    CU_TRY(cudaDeviceGetDefaultMemPool(&pool, index));
    uint64_t keep = UINT64_MAX;  // cache freed blocks: never trim at a synchronization
    CU_TRY(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
    m.pool_ready = true;
    return IT_OK;
}

static void read_reserved(int index, it_memory_stats *s) {
    cudaMemPool_t pool;
    uint64_t cur = 0, high = 0;
    if (cudaDeviceGetDefaultMemPool(&pool, index) == cudaSuccess &&
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &cur) == cudaSuccess &&
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high) == cudaSuccess) {
        s->reserved_bytes = cur;
        s->peak_reserved_bytes = high;
    }
    cudaGetLastError();
}

extern "C" it_status it_cuda_malloc(it_device device, size_t nbytes, void **out) {
    IT_CU_TRY(it_cuda_use(device));
    DeviceMemory &m = memory[device.index];
    std::lock_guard<std::mutex> guard(m.lock);
    IT_CU_TRY(ready_pool(device.index));
    uint64_t before = m.stats.reserved_bytes;
    cudaError_t e = cudaMallocAsync(out, nbytes ? nbytes : 1, it_cuda_stream(device));
    if (e != cudaSuccess) {
        cudaGetLastError();
        return it_cuda_error(IT_ERR_OUT_OF_MEMORY, "out of memory on cuda:%d: could not allocate %zu "
                             "bytes (%llu bytes already in use by tensors; %s)", (int)device.index, nbytes,
                             (unsigned long long)m.stats.allocated_bytes, cudaGetErrorString(e));
    }
    read_reserved(device.index, &m.stats);
    m.stats.num_allocs++;
    if (m.stats.reserved_bytes == before) m.stats.num_cache_hits++;
    m.stats.allocated_bytes += nbytes;
    if (m.stats.allocated_bytes > m.stats.peak_allocated_bytes)
        m.stats.peak_allocated_bytes = m.stats.allocated_bytes;
    return IT_OK;
}

extern "C" it_status it_cuda_free(it_device device, void *ptr, size_t nbytes) {
    IT_CU_TRY(it_cuda_use(device));
    DeviceMemory &m = memory[device.index];
    std::lock_guard<std::mutex> guard(m.lock);
    CU_TRY(cudaFreeAsync(ptr, it_cuda_stream(device)));
    m.stats.allocated_bytes -= nbytes;
    return IT_OK;
}

extern "C" it_status it_cuda_memory_stats_get(it_device device, it_memory_stats *out) {
    IT_CU_TRY(it_cuda_use(device));
    DeviceMemory &m = memory[device.index];
    std::lock_guard<std::mutex> guard(m.lock);
    read_reserved(device.index, &m.stats);
    *out = m.stats;
    return IT_OK;
}

extern "C" it_status it_cuda_memory_reset_peak(it_device device) {
    IT_CU_TRY(it_cuda_use(device));
    DeviceMemory &m = memory[device.index];
    std::lock_guard<std::mutex> guard(m.lock);
    m.stats.peak_allocated_bytes = m.stats.allocated_bytes;
    cudaMemPool_t pool;
    uint64_t zero = 0;
    if (cudaDeviceGetDefaultMemPool(&pool, device.index) == cudaSuccess)
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero);
    cudaGetLastError();
    return IT_OK;
}

extern "C" it_status it_cuda_memory_empty_cache(it_device device) {
    IT_CU_TRY(it_cuda_use(device));
    CU_TRY(cudaDeviceSynchronize());  // what is cached may still be in use by queued work
    cudaMemPool_t pool;
    CU_TRY(cudaDeviceGetDefaultMemPool(&pool, device.index));
    CU_TRY(cudaMemPoolTrimTo(pool, 0));
    return IT_OK;
}

// ---- copies -----------------------------------------------------------------------------------
// Ordered on the current stream of the CUDA side; a copy to or from host memory has finished
// when it returns (the host may read or reuse its buffer at once, as .cpu() promises). Between
// two devices each has its own stream: the source's queued work (what writes src) is waited
// for first, and the copy has finished when this returns (the source's stream may free or
// overwrite src next).
extern "C" it_status it_cuda_memcpy(it_device dst_device, void *dst, it_device src_device,
                                    const void *src, size_t nbytes) {
    it_device on = dst_device.type == IT_CUDA ? dst_device : src_device;
    bool across = dst_device.type == IT_CUDA && src_device.type == IT_CUDA && dst_device.index != src_device.index;
    if (across) {
        IT_CU_TRY(it_cuda_use(src_device));
        CU_TRY(cudaStreamSynchronize(it_cuda_stream(src_device)));
        IT_CU_TRY(it_cuda_use(on));
        cudaStream_t s = it_cuda_stream(on);
        CU_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, s));
        CU_TRY(cudaStreamSynchronize(s));
        return IT_OK;
    }
    IT_CU_TRY(it_cuda_use(on));
    cudaStream_t s = it_cuda_stream(on);
    CU_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, s));
    if (dst_device.type != IT_CUDA || src_device.type != IT_CUDA) {
        CU_TRY(cudaStreamSynchronize(s));
        return it_cuda_check_index_flag(on);  // the host reads results now: report bad indices
    }
    return IT_OK;
}

// Queued on `stream` (NULL: the current stream of the CUDA side) and returns at once: the copy
// runs beside kernels of other streams. Host memory it touches must be pinned
// (it_cuda_host_alloc) to be copied by the copy engine without the runtime staging it, and must
// not be read (D2H) or overwritten (H2D) until an event recorded after the copy is complete.
extern "C" it_status it_cuda_memcpy_async(it_device dst_device, void *dst, it_device src_device,
                                          const void *src, size_t nbytes, void *stream) {
    it_device on = dst_device.type == IT_CUDA ? dst_device : src_device;
    IT_CU_TRY(it_cuda_use(on));
    CU_TRY(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault,
                           stream ? (cudaStream_t)stream : it_cuda_stream(on)));
    return IT_OK;
}

// ---- pinned host memory ---------------------------------------------------------------------
// Page-locked, and portable: every device's copy engine reaches it. Made in the calling thread's
// current device's context (the device it last used), not cuda:0's: a rank on cuda:3 must not
// open a context on cuda:0 just to pin memory.
extern "C" it_status it_cuda_host_alloc(size_t nbytes, void **out) {
    if (count_devices() == 0)
        return it_cuda_error(IT_ERR_NO_CUDA, "no CUDA device to pin host memory for: %s",
                             device_count_error != cudaSuccess ? cudaGetErrorString(device_count_error)
                                                               : "the driver reports none");
    if (cudaHostAlloc(out, nbytes ? nbytes : 1, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        *out = nullptr;
        return it_cuda_error(IT_ERR_OUT_OF_MEMORY, "cannot pin %zu bytes of host memory (cudaHostAlloc): "
                             "the system's locked-memory limit or its free memory is too small", nbytes);
    }
    return IT_OK;
}

extern "C" it_status it_cuda_host_free(void *ptr) {
    CU_TRY(cudaFreeHost(ptr));
    return IT_OK;
}

// ---- description ------------------------------------------------------------------------------
const char *it_cuda_blas_status(void);  // matmul.cu
const char *it_cuda_nccl_status(void);  // nccl.cu

extern "C" const char *it_cuda_info(void) {
    static thread_local char info[768];
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    int n = count_devices();
    char devices[256] = "";
    for (int i = 0; i < n && i < 8; i++) {
        cudaDeviceProp p;
        if (cudaGetDeviceProperties(&p, i) == cudaSuccess) {
            size_t len = strlen(devices);
            snprintf(devices + len, sizeof devices - len, "%s%s (sm_%d%d)", i ? ", " : "", p.name,
                     p.major, p.minor);
        }
    }
    cudaGetLastError();
    const char *none = device_count_error != cudaSuccess ? cudaGetErrorString(device_count_error)
                                                         : "the driver reports none";
    snprintf(info, sizeof info, "libinfinitrain_cuda.so, CUDA runtime %d.%d, %d device(s) (%s); "
             "cuBLAS: %s; NCCL: %s", runtime / 1000, (runtime % 1000) / 10, n, n ? devices : none,
             it_cuda_blas_status(), it_cuda_nccl_status());
    return info;
}
