// NCCL, opened at run time by its soname (libnccl.so.2, the nvidia-nccl wheel's) like cuBLAS,
// so that this library builds and loads without it. The entry points used are declared here
// as NCCL's C API defines them (nccl.h: ncclUniqueId is 128 bytes; data types int8 = 0 ...
// bfloat16 = 9; reductions sum = 0, prod = 1, max = 2, min = 3, avg = 4).
#include <dlfcn.h>
#include <mutex>
#include <string.h>

#include "common.cuh"

namespace {
typedef int ncclResult_t;  // ncclSuccess = 0
typedef struct ncclComm *ncclComm_t;
struct ncclUniqueId {
    char internal[128];
};

struct Nccl {
    void *lib = nullptr;
    char why[512] = "";
    ncclResult_t (*get_unique_id)(ncclUniqueId *) = nullptr;
    ncclResult_t (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int) = nullptr;
    ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
    const char *(*error_string)(ncclResult_t) = nullptr;
    ncclResult_t (*all_reduce)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
    ncclResult_t (*all_gather)(const void *, void *, size_t, int, ncclComm_t, cudaStream_t) = nullptr;
    ncclResult_t (*reduce_scatter)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
    ncclResult_t (*broadcast)(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
    ncclResult_t (*send)(const void *, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
    ncclResult_t (*recv)(void *, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
    ncclResult_t (*group_start)() = nullptr;
    ncclResult_t (*group_end)() = nullptr;
};
Nccl nccl;
std::once_flag nccl_once;

template <typename F> bool bind(F &f, const char *name) {
    f = (F)dlsym(nccl.lib, name);
    return f != nullptr;
}

void open_nccl() {
    if (!(nccl.lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL))) {
        snprintf(nccl.why, sizeof nccl.why, "not found (%s); install it with pip install "
                 "'infinitrain[cuda%d]' (the nvidia-nccl-cu%d wheel)", dlerror(), CUDART_VERSION / 1000,
                 CUDART_VERSION / 1000);
        return;
    }
    bool ok = bind(nccl.get_unique_id, "ncclGetUniqueId") & bind(nccl.comm_init_rank, "ncclCommInitRank") &
              bind(nccl.comm_destroy, "ncclCommDestroy") & bind(nccl.error_string, "ncclGetErrorString") &
              bind(nccl.all_reduce, "ncclAllReduce") & bind(nccl.all_gather, "ncclAllGather") &
              bind(nccl.reduce_scatter, "ncclReduceScatter") & bind(nccl.broadcast, "ncclBroadcast") &
              bind(nccl.send, "ncclSend") & bind(nccl.recv, "ncclRecv") &
              bind(nccl.group_start, "ncclGroupStart") & bind(nccl.group_end, "ncclGroupEnd");
    if (!ok) {
        snprintf(nccl.why, sizeof nccl.why, "the libnccl.so.2 found lacks an entry point (NCCL 2.7 or "
                 "newer is needed for send/recv)");
        nccl.lib = nullptr;
    }
}

it_status ready(const char *fn) {
    std::call_once(nccl_once, open_nccl);
    if (!nccl.lib) return it_cuda_error(IT_ERR_NO_CUDA, "NCCL %s", nccl.why);
    return IT_OK;
}

#define NCCL_TRY(expr, fn)                                                                   \
    do {                                                                                     \
        ncclResult_t r_ = (expr);                                                            \
        if (r_ != 0) return it_cuda_error(IT_ERR_NCCL, "%s (NCCL error %d)", \
                                          nccl.error_string(r_), r_);                        \
    } while (0)

int nccl_type(it_dtype dt) {
    switch (dt) {
    case IT_FLOAT32: return 7;
    case IT_BFLOAT16: return 9;
    case IT_FLOAT16: return 6;
    case IT_INT32: return 2;
    case IT_INT64: return 4;
    case IT_FLOAT64: return 8;
    default: return 1;  // IT_UINT8, IT_BOOL: uint8
    }
}

int nccl_op(it_comm_op op) {
    switch (op) {
    case IT_COMM_AVG: return 4;
    case IT_COMM_MAX: return 2;
    case IT_COMM_MIN: return 3;
    default: return 0;  // sum
    }
}
}  // namespace

const char *it_cuda_nccl_status(void) {
    std::call_once(nccl_once, open_nccl);
    if (!nccl.lib) return nccl.why;
    static char where[600];
    Dl_info info;  // the file the loader chose
    void *sym = (void *)nccl.get_unique_id;
    snprintf(where, sizeof where, "%s", sym && dladdr(sym, &info) && info.dli_fname ? info.dli_fname : "found");
    return where;
}

extern "C" {

it_status it_cuda_comm_unique_id(it_device device, uint8_t *id, size_t size) {
    IT_CU_TRY(ready("it_comm_unique_id"));
    ncclUniqueId uid;
    NCCL_TRY(nccl.get_unique_id(&uid), "it_comm_unique_id");
    memcpy(id, uid.internal, sizeof uid.internal);
    return IT_OK;
}

it_status it_cuda_comm_init(it_device device, const uint8_t *id, size_t size, int32_t nranks, int32_t rank,
                            void **comm) {
    IT_CU_TRY(ready("it_comm_init"));
    IT_CU_TRY(it_cuda_use(device));
    ncclUniqueId uid;
    memcpy(uid.internal, id, sizeof uid.internal);
    ncclComm_t c;
    NCCL_TRY(nccl.comm_init_rank(&c, nranks, uid, rank), "it_comm_init");
    *comm = (void *)c;
    return IT_OK;
}

it_status it_cuda_comm_destroy(it_device device, void *comm) {
    IT_CU_TRY(ready("it_comm_destroy"));
    NCCL_TRY(nccl.comm_destroy((ncclComm_t)comm), "it_comm_destroy");
    return IT_OK;
}

it_status it_cuda_comm_call(it_device device, void *comm, int32_t kind, it_dtype dtype, const void *send,
                            void *recv, int64_t count, it_comm_op op, int32_t arg, void *stream) {
    IT_CU_TRY(ready("it_comm"));
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = stream ? (cudaStream_t)stream : it_cuda_stream(device);
    ncclComm_t c = (ncclComm_t)comm;
    int t = nccl_type(dtype), o = nccl_op(op);
    size_t n = (size_t)count;
    switch (kind) {
    case 0: NCCL_TRY(nccl.all_reduce(send, recv, n, t, o, c, s), "it_comm_all_reduce"); break;
    case 1: NCCL_TRY(nccl.all_gather(send, recv, n, t, c, s), "it_comm_all_gather"); break;
    case 2: NCCL_TRY(nccl.reduce_scatter(send, recv, n, t, o, c, s), "it_comm_reduce_scatter"); break;
    case 3: NCCL_TRY(nccl.broadcast(send, recv, n, t, arg, c, s), "it_comm_broadcast"); break;
    case 4: NCCL_TRY(nccl.send(send, n, t, arg, c, s), "it_comm_send"); break;
    default: NCCL_TRY(nccl.recv(recv, n, t, arg, c, s), "it_comm_recv"); break;
    }
    return IT_OK;
}

it_status it_cuda_comm_all_to_all(it_device device, void *comm, int32_t nranks, int32_t rank, it_dtype dtype,
                                  const void *send, const int64_t *send_counts, const int64_t *send_offsets,
                                  void *recv, const int64_t *recv_counts, const int64_t *recv_offsets,
                                  void *stream) {
    IT_CU_TRY(ready("it_comm_all_to_all"));
    IT_CU_TRY(it_cuda_use(device));
    cudaStream_t s = stream ? (cudaStream_t)stream : it_cuda_stream(device);
    ncclComm_t c = (ncclComm_t)comm;
    int t = nccl_type(dtype);
    size_t bytes = dtype_bytes(dtype);
    const char *from = (const char *)send;
    char *to = (char *)recv;
    if (send_counts[rank] > 0)  // this rank's own block: a copy on the stream, not a message
        CU_TRY(cudaMemcpyAsync(to + recv_offsets[rank] * bytes, from + send_offsets[rank] * bytes,
                                 (size_t)send_counts[rank] * bytes, cudaMemcpyDeviceToDevice, s));
    // every send and receive in one group: NCCL runs them together, none waits on another
    NCCL_TRY(nccl.group_start(), "it_comm_all_to_all");
    ncclResult_t failed = 0;
    for (int32_t k = 0; k < nranks && failed == 0; ++k) {
        if (k == rank) continue;
        if (send_counts[k] > 0)
            failed = nccl.send(from + send_offsets[k] * bytes, (size_t)send_counts[k], t, k, c, s);
        if (failed == 0 && recv_counts[k] > 0)
            failed = nccl.recv(to + recv_offsets[k] * bytes, (size_t)recv_counts[k], t, k, c, s);
    }
    ncclResult_t ended = nccl.group_end();  // closed even after a failure: the group must not stay open
    NCCL_TRY(failed, "it_comm_all_to_all");
    NCCL_TRY(ended, "it_comm_all_to_all");
    return IT_OK;
}

}  // extern "C"
