/* Devices: the check every kernel entry point makes first, and the hand-over of a CUDA device's
 * call to libinfinitrain_cuda.so (device.c). Not part of the ABI. */
#ifndef IT_DEVICE_H
#define IT_DEVICE_H

#include "status.h"

/* Every kernel entry point checks its device first (a known type: cpu:0, or cuda:N), then
 * its other arguments; then IT_DISPATCH hands a CUDA device to the CUDA library and the CPU
 * runs the code that follows. */
it_status it_check_device(it_device device, const char *fn);
#define IT_CHECK_DEVICE(device, fn) IT_TRY(it_check_device((device), (fn)))

/* libinfinitrain_cuda.so (beside this library) is opened on the first CUDA call, so that a
 * CPU install needs no CUDA library. A build or machine without it answers IT_ERR_NO_CUDA
 * saying why; an op it does not implement, IT_ERR_NOT_SUPPORTED. it_cuda_failed(status, fn)
 * carries the CUDA library's message over to it_last_error(). */
it_status it_cuda_symbol(const char *symbol, const char *fn, void **out);
it_status it_cuda_failed(it_status status, const char *fn);
#define IT_CUDA_CALL(fn, sym, ...)                                                           \
    do {                                                                                     \
        static __typeof__(&sym) impl_;                                                       \
        if (!impl_) IT_TRY(it_cuda_symbol(#sym, (fn), (void **)&impl_));                     \
        it_status st_ = impl_(__VA_ARGS__);                                                  \
        if (st_ != IT_OK) return it_cuda_failed(st_, (fn));                                  \
    } while (0)
/* After the checks: a CUDA device runs it_cuda_<op>(device, <the same arguments>). */
#define IT_DISPATCH(op, device, ...)                                                         \
    do {                                                                                     \
        if ((device).type == IT_CUDA) {                                                      \
            static __typeof__(&it_##op) cuda_;                                               \
            if (!cuda_) IT_TRY(it_cuda_symbol("it_cuda_" #op, "it_" #op, (void **)&cuda_));  \
            it_status st_ = cuda_((device), __VA_ARGS__);                                    \
            return st_ == IT_OK ? IT_OK : it_cuda_failed(st_, "it_" #op);                    \
        }                                                                                    \
    } while (0)

/* A stream's CUDA handle (NULL stands for the current stream) and its device. */
void *it_stream_handle(const it_stream *stream);
it_device it_stream_device(const it_stream *stream);

/* What CUDA this library can reach, for it_build_info(). */
const char *it_cuda_describe(void);

#endif
