/* What libinfinitrain asks of libinfinitrain_cuda.so besides the kernels (each kernel's CUDA
 * implementation, it_cuda_<op>, has the signature of its public it_<op>). Not part of the ABI:
 * both libraries are built from this tree together. Streams and events cross as the CUDA
 * runtime's handles (cudaStream_t / cudaEvent_t) behind void pointers. */
#ifndef IT_CUDA_BRIDGE_H
#define IT_CUDA_BRIDGE_H

#include "infinitrain.h"

#ifdef __cplusplus
extern "C" {
#endif

const char *it_cuda_last_error(void);  /* the CUDA library's message for its last failure */
const char *it_cuda_info(void);        /* toolkit, devices, cuBLAS/NCCL found or why not */
it_status it_cuda_device_count(int32_t *count);

it_status it_cuda_malloc(it_device device, size_t nbytes, void **out);
it_status it_cuda_free(it_device device, void *ptr, size_t nbytes);
it_status it_cuda_memory_stats_get(it_device device, it_memory_stats *out);
it_status it_cuda_memory_reset_peak(it_device device);
it_status it_cuda_memory_empty_cache(it_device device);
it_status it_cuda_memcpy(it_device dst_device, void *dst, it_device src_device, const void *src,
                         size_t nbytes);
it_status it_cuda_memcpy_async(it_device dst_device, void *dst, it_device src_device, const void *src,
                               size_t nbytes, void *stream);
it_status it_cuda_host_alloc(size_t nbytes, void **out);
it_status it_cuda_host_free(void *ptr);

it_status it_cuda_stream_create(it_device device, void **out);
it_status it_cuda_stream_destroy(it_device device, void *stream);
it_status it_cuda_stream_synchronize(it_device device, void *stream);
it_status it_cuda_set_stream(it_device device, void *stream);  /* NULL: the device's own */
it_status it_cuda_event_create(it_device device, void **out);
it_status it_cuda_event_destroy(it_device device, void *event);
it_status it_cuda_event_record(it_device device, void *event, void *stream);
it_status it_cuda_stream_wait_event(it_device device, void *stream, void *event);
it_status it_cuda_event_synchronize(it_device device, void *event);
it_status it_cuda_event_query(it_device device, void *event, int32_t *done);
it_status it_cuda_event_create_timing(it_device device, void **out);
it_status it_cuda_event_elapsed_time(it_device device, void *start, void *end, float *ms);
it_status it_cuda_device_synchronize(it_device device);

/* NCCL: `comm` is an ncclComm_t; kind 0 all-reduce, 1 all-gather, 2 reduce-scatter,
 * 3 broadcast (arg: root), 4 send, 5 recv (arg: peer) */
it_status it_cuda_comm_unique_id(it_device device, uint8_t *id, size_t size);
it_status it_cuda_comm_init(it_device device, const uint8_t *id, size_t size, int32_t nranks,
                            int32_t rank, void **comm);
it_status it_cuda_comm_destroy(it_device device, void *comm);
it_status it_cuda_comm_call(it_device device, void *comm, int32_t kind, it_dtype dtype,
                            const void *send, void *recv, int64_t count, it_comm_op op,
                            int32_t arg, void *stream);
/* NCCL: the all-to-all's grouped sends and receives (counts and offsets in elements, checked) */
it_status it_cuda_comm_all_to_all(it_device device, void *comm, int32_t nranks, int32_t rank, it_dtype dtype,
                                  const void *send, const int64_t *send_counts, const int64_t *send_offsets,
                                  void *recv, const int64_t *recv_counts, const int64_t *recv_offsets,
                                  void *stream);

#ifdef __cplusplus
}
#endif

#endif
