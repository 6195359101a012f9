/* Devices: checking them, counting them, streams and events, and the CUDA library, which is
 * opened on the first CUDA call so that the CPU library needs no CUDA at all. */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "device.h"
#include "status.h"
#include "cuda_bridge.h"

it_status it_check_device(it_device device, const char *fn) {
    if (device.type == IT_CPU) {
        IT_CHECK_ARG(device.index == 0, "%s: there is one CPU device, cpu:0; got cpu:%d", fn,
                     (int)device.index);
        return IT_OK;
    }
    if (device.type == IT_CUDA) {
        IT_CHECK_ARG(device.index >= 0, "%s: cuda:%d is not a device index", fn, (int)device.index);
        return IT_OK;
    }
    return it_set_error(IT_ERR_INVALID_ARGUMENT, "%s: unknown device type %d", fn,
                        (int)device.type);
}

/* ---- the CUDA library ------------------------------------------------------------------ */
static void *cuda_lib;
static char cuda_why[768];
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static const char *(*cuda_message)(void);

static void cuda_open(void) {
    char path[4096] = "libinfinitrain_cuda.so";
    /* a CUDA library built apart from this one (the test suite's emulated GPU, a debug build) */
    const char *chosen = getenv("INFINITRAIN_CUDA_LIBRARY");
    if (chosen && *chosen) {
        snprintf(path, sizeof path, "%s", chosen);
    } else {
#ifndef IT_WITH_CUDA
        snprintf(cuda_why, sizeof cuda_why, "this build of libinfinitrain has no CUDA support; "
                 "reinstall with INFINITRAIN_CUDA=ON on a machine with nvcc");
        return;
#else
        /* libinfinitrain_cuda.so is installed beside this library */
        Dl_info self;
        if (dladdr((void *)&cuda_open, &self) && self.dli_fname) {
            const char *slash = strrchr(self.dli_fname, '/');
            if (slash) snprintf(path, sizeof path, "%.*s/libinfinitrain_cuda.so",
                                (int)(slash - self.dli_fname), self.dli_fname);
        }
#endif
    }
    cuda_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!cuda_lib) {
        snprintf(cuda_why, sizeof cuda_why, "the CUDA library could not be loaded (%s)", dlerror());
        return;
    }
    cuda_message = (const char *(*)(void))dlsym(cuda_lib, "it_cuda_last_error");
}

it_status it_cuda_symbol(const char *symbol, const char *fn, void **out) {
    pthread_once(&cuda_once, cuda_open);
    if (!cuda_lib) return it_set_error(IT_ERR_NO_CUDA, "%s: %s", fn, cuda_why);
    void *p = dlsym(cuda_lib, symbol);
    if (!p)
        return it_set_error(IT_ERR_NOT_SUPPORTED, "%s is not implemented for CUDA devices yet "
                            "(libinfinitrain_cuda.so has no %s)", fn, symbol);
    *out = p;
    return IT_OK;
}

it_status it_cuda_failed(it_status status, const char *fn) {
    return it_set_error(status, "%s: %s", fn, cuda_message ? cuda_message() : "the CUDA library failed");
}

const char *it_cuda_describe(void) {
    pthread_once(&cuda_once, cuda_open);
    if (!cuda_lib) return cuda_why;
    const char *(*info)(void) = (const char *(*)(void))dlsym(cuda_lib, "it_cuda_info");
    return info ? info() : "libinfinitrain_cuda.so (no description)";
}

it_status it_device_count(it_device_type type, int32_t *count) {
    IT_CHECK_PTR(count, "it_device_count");
    if (type == IT_CPU) {
        *count = 1;
        return IT_OK;
    }
    IT_CHECK_ARG(type == IT_CUDA, "it_device_count: unknown device type %d", (int)type);
    *count = 0;  /* no CUDA library, no driver or no GPU: no CUDA device, not an error */
    void *fn = NULL;
    if (it_cuda_symbol("it_cuda_device_count", "it_device_count", &fn) != IT_OK) return IT_OK;
    if (((it_status(*)(int32_t *))fn)(count) != IT_OK) *count = 0;
    return IT_OK;
}

it_status it_device_synchronize(it_device device) {
    IT_CHECK_DEVICE(device, "it_device_synchronize");
    if (device.type == IT_CUDA) IT_CUDA_CALL("it_device_synchronize", it_cuda_device_synchronize, device);
    return IT_OK;
}

/* ---- streams and events ---------------------------------------------------------------- */
/* A CUDA stream or event keeps the runtime's handle; the CPU's need none: its work is done
 * when the call returns. */
struct it_stream {
    it_device device;
    void *handle;
};

/* The stream handle of a stream given to a collective: NULL stands for the current one. */
void *it_stream_handle(const it_stream *stream) { return stream ? stream->handle : NULL; }
it_device it_stream_device(const it_stream *stream) { return stream->device; }

struct it_event {
    it_device device;
    void *handle;
    int timing;  /* made by it_event_create_timing */
};

it_status it_stream_create(it_device device, it_stream **out) {
    IT_CHECK_PTR(out, "it_stream_create");
    *out = NULL;
    IT_CHECK_DEVICE(device, "it_stream_create");
    void *handle = NULL;
    if (device.type == IT_CUDA) IT_CUDA_CALL("it_stream_create", it_cuda_stream_create, device, &handle);
    it_stream *s = (it_stream *)malloc(sizeof *s);
    IT_REQUIRE(s, IT_ERR_OUT_OF_MEMORY, "it_stream_create: out of host memory");
    *s = (it_stream){.device = device, .handle = handle};
    *out = s;
    return IT_OK;
}

it_status it_stream_destroy(it_stream *stream) {
    if (!stream) return IT_OK;
    if (stream->device.type == IT_CUDA && stream->handle)
        IT_CUDA_CALL("it_stream_destroy", it_cuda_stream_destroy, stream->device, stream->handle);
    free(stream);
    return IT_OK;
}

it_status it_stream_synchronize(it_stream *stream) {
    IT_CHECK_PTR(stream, "it_stream_synchronize");
    if (stream->device.type == IT_CUDA)
        IT_CUDA_CALL("it_stream_synchronize", it_cuda_stream_synchronize, stream->device, stream->handle);
    return IT_OK;
}

it_status it_set_stream(it_device device, it_stream *stream) {
    IT_CHECK_DEVICE(device, "it_set_stream");
    IT_CHECK_ARG(!stream || (stream->device.type == device.type && stream->device.index == device.index),
                 "it_set_stream: the stream belongs to another device");
    if (device.type == IT_CUDA)
        IT_CUDA_CALL("it_set_stream", it_cuda_set_stream, device, stream ? stream->handle : NULL);
    return IT_OK;
}

static it_status event_create(it_device device, it_event **out, int timing, const char *fn) {
    IT_CHECK_PTR(out, fn);
    *out = NULL;
    IT_CHECK_DEVICE(device, fn);
    void *handle = NULL;
    if (device.type == IT_CUDA) {
        if (timing) IT_CUDA_CALL(fn, it_cuda_event_create_timing, device, &handle);
        else IT_CUDA_CALL(fn, it_cuda_event_create, device, &handle);
    }
    it_event *e = (it_event *)malloc(sizeof *e);
    IT_REQUIRE(e, IT_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    *e = (it_event){.device = device, .handle = handle, .timing = timing};
    *out = e;
    return IT_OK;
}

it_status it_event_create(it_device device, it_event **out) {
    return event_create(device, out, 0, "it_event_create");
}

it_status it_event_create_timing(it_device device, it_event **out) {
    return event_create(device, out, 1, "it_event_create_timing");
}

it_status it_event_elapsed_time(it_event *start, it_event *end, float *ms) {
    IT_CHECK_PTR(start, "it_event_elapsed_time");
    IT_CHECK_PTR(end, "it_event_elapsed_time");
    IT_CHECK_PTR(ms, "it_event_elapsed_time");
    IT_CHECK_ARG(start->device.type == end->device.type && start->device.index == end->device.index,
                 "it_event_elapsed_time: the two events are on different devices");
    IT_CHECK_ARG(start->timing && end->timing,
                 "it_event_elapsed_time: both events must be made by it_event_create_timing");
    IT_REQUIRE(start->device.type == IT_CUDA, IT_ERR_NOT_SUPPORTED,
               "it_event_elapsed_time: CPU events carry no time (the host's clock times CPU work)");
    IT_CUDA_CALL("it_event_elapsed_time", it_cuda_event_elapsed_time, start->device, start->handle, end->handle,
                 ms);
    return IT_OK;
}

it_status it_event_destroy(it_event *event) {
    if (!event) return IT_OK;
    if (event->device.type == IT_CUDA && event->handle)
        IT_CUDA_CALL("it_event_destroy", it_cuda_event_destroy, event->device, event->handle);
    free(event);
    return IT_OK;
}

static it_status same_device(const it_event *event, const it_stream *stream, const char *fn) {
    IT_CHECK_ARG(!stream || (stream->device.type == event->device.type &&
                             stream->device.index == event->device.index),
                 "%s: the event and the stream are on different devices", fn);
    return IT_OK;
}

it_status it_event_record(it_event *event, it_stream *stream) {
    IT_CHECK_PTR(event, "it_event_record");
    IT_TRY(same_device(event, stream, "it_event_record"));
    if (event->device.type == IT_CUDA)
        IT_CUDA_CALL("it_event_record", it_cuda_event_record, event->device, event->handle,
                     stream ? stream->handle : NULL);
    return IT_OK;
}

it_status it_stream_wait_event(it_stream *stream, it_event *event) {
    IT_CHECK_PTR(event, "it_stream_wait_event");
    IT_TRY(same_device(event, stream, "it_stream_wait_event"));
    if (event->device.type == IT_CUDA)
        IT_CUDA_CALL("it_stream_wait_event", it_cuda_stream_wait_event, event->device,
                     stream ? stream->handle : NULL, event->handle);
    return IT_OK;
}

it_status it_event_synchronize(it_event *event) {
    IT_CHECK_PTR(event, "it_event_synchronize");
    if (event->device.type == IT_CUDA)
        IT_CUDA_CALL("it_event_synchronize", it_cuda_event_synchronize, event->device, event->handle);
    return IT_OK;
}

it_status it_event_query(it_event *event, int32_t *done) {
    IT_CHECK_PTR(event, "it_event_query");
    IT_CHECK_PTR(done, "it_event_query");
    *done = 1;
    if (event->device.type == IT_CUDA)
        IT_CUDA_CALL("it_event_query", it_cuda_event_query, event->device, event->handle, done);
    return IT_OK;
}
