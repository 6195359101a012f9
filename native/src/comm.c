/* Collective communication between GPUs: the checks, then NCCL inside the CUDA library. */
#include "common.h"
#include "cuda_bridge.h"

#define IT_COMM_ID_BYTES 128

struct it_comm {
    it_device device;
    int32_t nranks, rank;
    void *handle; /* ncclComm_t */
};

static it_status check_cuda_device(it_device device, const char *fn) {
    IT_CHECK_DEVICE(device, fn);
    IT_REQUIRE(device.type == IT_CUDA, IT_ERR_NOT_SUPPORTED,
               "%s: communicators join GPUs (NCCL); CPU tensors use MPI", fn);
    return IT_OK;
}

it_status it_comm_unique_id(it_device device, uint8_t *id, size_t size) {
    IT_TRY(check_cuda_device(device, "it_comm_unique_id"));
    IT_CHECK_PTR(id, "it_comm_unique_id");
    IT_CHECK_ARG(size >= IT_COMM_ID_BYTES, "it_comm_unique_id: the id needs %d bytes, got %zu",
                 IT_COMM_ID_BYTES, size);
    IT_CUDA_CALL("it_comm_unique_id", it_cuda_comm_unique_id, device, id, size);
    return IT_OK;
}

it_status it_comm_init(it_device device, const uint8_t *id, size_t size, int32_t nranks,
                       int32_t rank, it_comm **out) {
    IT_CHECK_PTR(out, "it_comm_init");
    *out = NULL;
    IT_TRY(check_cuda_device(device, "it_comm_init"));
    IT_CHECK_PTR(id, "it_comm_init");
    IT_CHECK_ARG(size >= IT_COMM_ID_BYTES, "it_comm_init: the id needs %d bytes, got %zu",
                 IT_COMM_ID_BYTES, size);
    IT_CHECK_ARG(nranks >= 1 && rank >= 0 && rank < nranks,
                 "it_comm_init: rank %d of %d ranks", (int)rank, (int)nranks);
    it_comm *c = (it_comm *)malloc(sizeof *c);
    IT_REQUIRE(c, IT_ERR_OUT_OF_MEMORY, "it_comm_init: out of host memory");
    *c = (it_comm){.device = device, .nranks = nranks, .rank = rank, .handle = NULL};
    static __typeof__(&it_cuda_comm_init) init_;
    if (!init_) {
        it_status found = it_cuda_symbol("it_cuda_comm_init", "it_comm_init", (void **)&init_);
        if (found != IT_OK) {  /* no CUDA library: its reason is the message */
            free(c);
            return found;
        }
    }
    void *handle = NULL;
    it_status st = init_(device, id, size, nranks, rank, &handle);
    if (st != IT_OK) {
        free(c);
        return it_cuda_failed(st, "it_comm_init");
    }
    c->handle = handle;
    *out = c;
    return IT_OK;
}

it_status it_comm_destroy(it_comm *comm) {
    if (!comm) return IT_OK;
    if (comm->handle) IT_CUDA_CALL("it_comm_destroy", it_cuda_comm_destroy, comm->device, comm->handle);
    free(comm);
    return IT_OK;
}

static it_status call(const char *fn, it_comm *comm, int32_t kind, it_dtype dtype, const void *send,
                      void *recv, int64_t count, it_comm_op op, int32_t arg, it_stream *stream) {
    IT_CHECK_PTR(comm, fn);
    IT_CHECK_ARG(dtype >= IT_FLOAT32 && dtype <= IT_BOOL, "%s: unknown dtype %d", fn, (int)dtype);
    IT_CHECK_SIZE(count, fn);
    IT_CHECK_PRODUCT(fn, 8, count, comm->nranks);
    IT_CHECK_ARG(op >= IT_COMM_SUM && op <= IT_COMM_MIN, "%s: unknown op %d", fn, (int)op);
    IT_CHECK_ARG(!stream || (it_stream_device(stream).type == IT_CUDA &&
                             it_stream_device(stream).index == comm->device.index),
                 "%s: the stream is not on the communicator's device", fn);
    if (count == 0) return IT_OK;
    IT_CHECK_ARG((send || kind == 5) && (recv || kind == 4), "%s: NULL buffer", fn);
    IT_CUDA_CALL(fn, it_cuda_comm_call, comm->device, comm->handle, kind, dtype, send, recv, count,
                 op, arg, it_stream_handle(stream));
    return IT_OK;
}

it_status it_comm_all_reduce(it_comm *comm, it_dtype dtype, const void *send, void *recv,
                             int64_t count, it_comm_op op, it_stream *stream) {
    return call("it_comm_all_reduce", comm, 0, dtype, send, recv, count, op, 0, stream);
}

it_status it_comm_all_gather(it_comm *comm, it_dtype dtype, const void *send, void *recv,
                             int64_t count, it_stream *stream) {
    return call("it_comm_all_gather", comm, 1, dtype, send, recv, count, IT_COMM_SUM, 0, stream);
}

it_status it_comm_reduce_scatter(it_comm *comm, it_dtype dtype, const void *send, void *recv,
                                 int64_t count, it_comm_op op, it_stream *stream) {
    return call("it_comm_reduce_scatter", comm, 2, dtype, send, recv, count, op, 0, stream);
}

it_status it_comm_broadcast(it_comm *comm, it_dtype dtype, const void *send, void *recv,
                            int64_t count, int32_t root, it_stream *stream) {
    IT_CHECK_ARG(comm && root >= 0 && root < comm->nranks, "it_comm_broadcast: root %d is not a rank",
                 (int)root);
    return call("it_comm_broadcast", comm, 3, dtype, send, recv, count, IT_COMM_SUM, root, stream);
}

it_status it_comm_send(it_comm *comm, it_dtype dtype, const void *buf, int64_t count, int32_t peer,
                       it_stream *stream) {
    IT_CHECK_ARG(comm && peer >= 0 && peer < comm->nranks && peer != comm->rank,
                 "it_comm_send: peer %d is not another rank", (int)peer);
    return call("it_comm_send", comm, 4, dtype, buf, NULL, count, IT_COMM_SUM, peer, stream);
}

it_status it_comm_recv(it_comm *comm, it_dtype dtype, void *buf, int64_t count, int32_t peer,
                       it_stream *stream) {
    IT_CHECK_ARG(comm && peer >= 0 && peer < comm->nranks && peer != comm->rank,
                 "it_comm_recv: peer %d is not another rank", (int)peer);
    return call("it_comm_recv", comm, 5, dtype, NULL, buf, count, IT_COMM_SUM, peer, stream);
}

static it_status check_blocks(const char *fn, const char *what, int32_t nranks, const int64_t *counts,
                              const int64_t *offsets, int64_t total) {
    IT_CHECK_ARG(counts && offsets, "%s: %s counts or offsets are NULL", fn, what);
    for (int32_t k = 0; k < nranks; ++k) {
        IT_CHECK_ARG(counts[k] >= 0 && offsets[k] >= 0 && offsets[k] <= total && counts[k] <= total - offsets[k],
                     "%s: %s block %d (%lld elements at %lld) is outside its %lld elements", fn, what, (int)k,
                     (long long)counts[k], (long long)offsets[k], (long long)total);
    }
    return IT_OK;
}

it_status it_comm_all_to_all(it_comm *comm, it_dtype dtype, const void *send, int64_t send_total,
                             const int64_t *send_counts, const int64_t *send_offsets, void *recv,
                             int64_t recv_total, const int64_t *recv_counts, const int64_t *recv_offsets,
                             it_stream *stream) {
    const char *fn = "it_comm_all_to_all";
    IT_CHECK_PTR(comm, fn);
    IT_CHECK_ARG(dtype >= IT_FLOAT32 && dtype <= IT_BOOL, "%s: unknown dtype %d", fn, (int)dtype);
    IT_CHECK_SIZE(send_total, fn);
    IT_CHECK_SIZE(recv_total, fn);
    IT_TRY(check_blocks(fn, "send", comm->nranks, send_counts, send_offsets, send_total));
    IT_TRY(check_blocks(fn, "recv", comm->nranks, recv_counts, recv_offsets, recv_total));
    IT_CHECK_ARG(send_counts[comm->rank] == recv_counts[comm->rank],
                 "%s: this rank sends itself %lld elements but receives %lld", fn,
                 (long long)send_counts[comm->rank], (long long)recv_counts[comm->rank]);
    IT_CHECK_ARG((send || send_total == 0) && (recv || recv_total == 0), "%s: NULL buffer", fn);
    // NCCL reads the sends while it writes the receives: the same memory would be garbage
    IT_CHECK_ARG(send_total == 0 || recv_total == 0 || send != recv, "%s: send must not alias recv", fn);
    IT_CHECK_ARG(!stream || (it_stream_device(stream).type == IT_CUDA &&
                             it_stream_device(stream).index == comm->device.index),
                 "%s: the stream is not on the communicator's device", fn);
    IT_CUDA_CALL(fn, it_cuda_comm_all_to_all, comm->device, comm->handle, comm->nranks, comm->rank, dtype, send,
                 send_counts, send_offsets, recv, recv_counts, recv_offsets, it_stream_handle(stream));
    return IT_OK;
}
