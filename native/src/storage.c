/* Storage and the CPU caching allocator.
 *
 * Why cache: a training step allocates and frees the same activation and gradient buffers
 * every step. glibc hands large blocks (mmap'd) back to the OS on free, so the next step
 * faults every page in again; measured on PyTorch's CPU build this costs ~40% of a small
 * GPT-2 step. Here a freed block goes into a bin for its size class and the next request of
 * that class takes it back without touching the OS.
 *
 * Size classes: everything up to 512 bytes is one class; above that each power-of-two range
 * is split into 4 classes below 1 MiB (<= 25% slack on small blocks) and 16 above (<= 6.25%
 * on the large activations that dominate memory).
 *
 * Bound: the cache holds at most as many free bytes as the most ever in use at once (a training
 * step's working set: what a step frees, the next takes back); beyond that the blocks freed
 * longest ago go back to the system. Unbounded, work whose sizes never repeat (sampling, where
 * each token's sequence is one longer) kept every size it ever used: GPT-2 small held 2.6 GB
 * for a 179 MB peak after 300 tokens.
 */
#include <pthread.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "device.h"
#include "status.h"
#include "cuda_bridge.h"

#define IT_ALIGNMENT 64
#define IT_NUM_BINS (64 * 16 + 1)

enum { BORROWED = 0, CACHED = 1, PINNED = 2 };  /* whose the memory is, and how it goes back */

struct it_storage {
    void *data;
    size_t nbytes;    /* what was asked for */
    size_t capacity;  /* the size class actually held */
    it_device device;
    int owns_data;    /* one of the above */
};

typedef struct it_free_block {
    void *ptr;
    size_t capacity;
    int bin;
    struct it_free_block *next, *prev;    /* in its bin, the most recently freed first */
    struct it_free_block *newer, *older;  /* in the cache's age list */
} it_free_block;

typedef struct it_cpu_cache {
    pthread_mutex_t lock;
    it_free_block *bins[IT_NUM_BINS];
    it_free_block *newest, *oldest;
    uint64_t cached_bytes;    /* free bytes in the bins */
    uint64_t most_allocated;  /* their bound: the most ever in use at once (not reset with the peaks) */
    it_memory_stats stats;
} it_cpu_cache;

static it_cpu_cache cpu_cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Rounds n up to its size class and returns the class's bin. */
static size_t size_class(size_t n, int *bin) {
    if (n <= 512) { *bin = 0; return 512; }
    int k = 63 - __builtin_clzll((unsigned long long)(n - 1)); /* 2^k < n <= 2^(k+1) */
    int splits_log2 = n <= ((size_t)1 << 20) ? 2 : 4;
    size_t step = (size_t)1 << (k - splits_log2);
    size_t rounded = (n + step - 1) / step * step;
    int j = (int)((rounded - ((size_t)1 << k)) / step); /* 1 .. 2^splits */
    *bin = 1 + k * 16 + (j - 1);
    return rounded;
}

/* Takes b out of its bin and the age list (the caller owns it then). */
static void cache_unlink(it_free_block *b) {
    if (b->prev) b->prev->next = b->next; else cpu_cache.bins[b->bin] = b->next;
    if (b->next) b->next->prev = b->prev;
    if (b->newer) b->newer->older = b->older; else cpu_cache.newest = b->older;
    if (b->older) b->older->newer = b->newer; else cpu_cache.oldest = b->newer;
    cpu_cache.cached_bytes -= b->capacity;
}

static void *cache_take(int bin) {
    it_free_block *b = cpu_cache.bins[bin];
    if (!b) return NULL;
    cache_unlink(b);
    void *p = b->ptr;
    free(b);
    return p;
}

/* Gives the oldest cached block back to the system. */
static void cache_release_oldest(void) {
    it_free_block *b = cpu_cache.oldest;
    cache_unlink(b);
    cpu_cache.stats.reserved_bytes -= b->capacity;
    free(b->ptr);
    free(b);
}

/* Caches a freed block (b holds it), then releases the oldest blocks beyond the bound. */
static void cache_put(it_free_block *b) {
    b->prev = NULL;
    b->next = cpu_cache.bins[b->bin];
    if (b->next) b->next->prev = b;
    cpu_cache.bins[b->bin] = b;
    b->newer = NULL;
    b->older = cpu_cache.newest;
    if (b->older) b->older->newer = b; else cpu_cache.oldest = b;
    cpu_cache.newest = b;
    cpu_cache.cached_bytes += b->capacity;
    while (cpu_cache.cached_bytes > cpu_cache.most_allocated && cpu_cache.oldest) cache_release_oldest();
}

static void release_all_cached(void) {
    while (cpu_cache.oldest) cache_release_oldest();
}

static void update_peaks(void) {
    it_memory_stats *s = &cpu_cache.stats;
    if (s->allocated_bytes > s->peak_allocated_bytes) s->peak_allocated_bytes = s->allocated_bytes;
    if (s->reserved_bytes > s->peak_reserved_bytes) s->peak_reserved_bytes = s->reserved_bytes;
}

static it_status it_storage_new_cuda(it_device device, size_t nbytes, void **out) {
    IT_CUDA_CALL("it_storage_new", it_cuda_malloc, device, nbytes, out);
    return IT_OK;
}

static it_status it_storage_free_cuda(it_storage *s) {
    IT_CUDA_CALL("it_storage_free", it_cuda_free, s->device, s->data, s->nbytes);
    return IT_OK;
}

it_status it_storage_new(it_device device, size_t nbytes, it_storage **out) {
    IT_CHECK_PTR(out, "it_storage_new");
    *out = NULL;
    IT_CHECK_DEVICE(device, "it_storage_new");
    IT_CHECK_ARG(nbytes < ((size_t)1 << 50), "it_storage_new: %zu bytes is not a sane size",
                 nbytes);
    it_storage *s = (it_storage *)malloc(sizeof *s);
    IT_REQUIRE(s, IT_ERR_OUT_OF_MEMORY, "it_storage_new: out of host memory");
    if (device.type == IT_CUDA) {  /* the CUDA library's caching allocator, per device */
        void *p = NULL;
        it_status st = it_storage_new_cuda(device, nbytes, &p);
        if (st != IT_OK) {
            free(s);
            return st;
        }
        *s = (it_storage){.data = p, .nbytes = nbytes, .capacity = nbytes, .device = device,
                          .owns_data = CACHED};
        *out = s;
        return IT_OK;
    }
    int bin;
    size_t cap = size_class(nbytes, &bin);

    pthread_mutex_lock(&cpu_cache.lock);
    void *p = cache_take(bin);
    cpu_cache.stats.num_allocs++;
    if (p) {
        cpu_cache.stats.num_cache_hits++;
    } else {
        if (posix_memalign(&p, IT_ALIGNMENT, cap) != 0) {
            release_all_cached(); /* give the cache back and try once more */
            if (posix_memalign(&p, IT_ALIGNMENT, cap) != 0) p = NULL;
        }
        if (p) cpu_cache.stats.reserved_bytes += cap;
    }
    if (p) {
        cpu_cache.stats.allocated_bytes += cap;
        update_peaks();
        if (cpu_cache.stats.allocated_bytes > cpu_cache.most_allocated)
            cpu_cache.most_allocated = cpu_cache.stats.allocated_bytes;
    }
    uint64_t in_use = cpu_cache.stats.allocated_bytes;
    pthread_mutex_unlock(&cpu_cache.lock);

    if (!p) {
        free(s);
        return it_set_error(IT_ERR_OUT_OF_MEMORY,
                            "out of CPU memory: could not allocate %zu bytes (%llu bytes already "
                            "in use by tensors)", nbytes, (unsigned long long)in_use);
    }
    *s = (it_storage){.data = p, .nbytes = nbytes, .capacity = cap, .device = device,
                      .owns_data = CACHED};
    *out = s;
    return IT_OK;
}

it_status it_storage_wrap(it_device device, void *data, size_t nbytes, it_storage **out) {
    IT_CHECK_PTR(out, "it_storage_wrap");
    *out = NULL;
    IT_CHECK_DEVICE(device, "it_storage_wrap");
    IT_CHECK_BYTES(nbytes, "it_storage_wrap");
    IT_CHECK_ARG(data != NULL || nbytes == 0, "it_storage_wrap: data is NULL");
    if (device.type == IT_CUDA) {  /* memory of a device this process can reach */
        int32_t count = 0;
        IT_TRY(it_device_count(IT_CUDA, &count));
        IT_REQUIRE(device.index < count, IT_ERR_INVALID_ARGUMENT,
                   "it_storage_wrap: cuda:%d is not a device here (%d CUDA device(s))", (int)device.index,
                   (int)count);
    }
    it_storage *s = (it_storage *)malloc(sizeof *s);
    IT_REQUIRE(s, IT_ERR_OUT_OF_MEMORY, "it_storage_wrap: out of host memory");
    *s = (it_storage){.data = data, .nbytes = nbytes, .capacity = nbytes, .device = device,
                      .owns_data = BORROWED};
    *out = s;
    return IT_OK;
}

static it_status pinned_new(size_t nbytes, void **out) {
    IT_CUDA_CALL("it_storage_new_pinned", it_cuda_host_alloc, nbytes, out);
    return IT_OK;
}

static it_status pinned_free(void *ptr) {
    IT_CUDA_CALL("it_storage_free", it_cuda_host_free, ptr);
    return IT_OK;
}

it_status it_storage_new_pinned(size_t nbytes, it_storage **out) {
    IT_CHECK_PTR(out, "it_storage_new_pinned");
    *out = NULL;
    IT_CHECK_ARG(nbytes < ((size_t)1 << 50), "it_storage_new_pinned: %zu bytes is not a sane size", nbytes);
    it_storage *s = (it_storage *)malloc(sizeof *s);
    IT_REQUIRE(s, IT_ERR_OUT_OF_MEMORY, "it_storage_new_pinned: out of host memory");
    void *p = NULL;
    it_status st = pinned_new(nbytes, &p);
    if (st != IT_OK) {
        free(s);
        return st;
    }
    it_device cpu = {IT_CPU, 0};
    *s = (it_storage){.data = p, .nbytes = nbytes, .capacity = nbytes, .device = cpu, .owns_data = PINNED};
    *out = s;
    return IT_OK;
}

int32_t it_storage_is_pinned(const it_storage *s) { return s && s->owns_data == PINNED; }

it_status it_storage_free(it_storage *s) {
    if (!s) return IT_OK;
    if (s->owns_data == PINNED) {
        it_status st = pinned_free(s->data);
        free(s);
        return st;
    }
    if (s->owns_data && s->device.type == IT_CUDA) {
        it_status st = it_storage_free_cuda(s);
        free(s);
        return st;
    }
    if (s->owns_data) {
        int bin;
        size_class(s->nbytes, &bin);
        it_free_block *b = (it_free_block *)malloc(sizeof *b);
        pthread_mutex_lock(&cpu_cache.lock);
        cpu_cache.stats.allocated_bytes -= s->capacity;
        if (b) {
            *b = (it_free_block){.ptr = s->data, .capacity = s->capacity, .bin = bin};
            cache_put(b);
        } else { /* cannot even cache it: give it back */
            free(s->data);
            cpu_cache.stats.reserved_bytes -= s->capacity;
        }
        pthread_mutex_unlock(&cpu_cache.lock);
    }
    free(s);
    return IT_OK;
}

void *it_storage_data(const it_storage *s) { return s ? s->data : NULL; }
size_t it_storage_nbytes(const it_storage *s) { return s ? s->nbytes : 0; }
it_device it_storage_device(const it_storage *s) {
    it_device cpu = {IT_CPU, 0};
    return s ? s->device : cpu;
}

it_status it_memory_stats_get(it_device device, it_memory_stats *out) {
    IT_CHECK_PTR(out, "it_memory_stats_get");
    IT_CHECK_DEVICE(device, "it_memory_stats_get");
    if (device.type == IT_CUDA) {
        IT_CUDA_CALL("it_memory_stats_get", it_cuda_memory_stats_get, device, out);
        return IT_OK;
    }
    pthread_mutex_lock(&cpu_cache.lock);
    *out = cpu_cache.stats;
    pthread_mutex_unlock(&cpu_cache.lock);
    return IT_OK;
}

it_status it_memory_reset_peak(it_device device) {
    IT_CHECK_DEVICE(device, "it_memory_reset_peak");
    if (device.type == IT_CUDA) {
        IT_CUDA_CALL("it_memory_reset_peak", it_cuda_memory_reset_peak, device);
        return IT_OK;
    }
    pthread_mutex_lock(&cpu_cache.lock);
    cpu_cache.stats.peak_allocated_bytes = cpu_cache.stats.allocated_bytes;
    cpu_cache.stats.peak_reserved_bytes = cpu_cache.stats.reserved_bytes;
    pthread_mutex_unlock(&cpu_cache.lock);
    return IT_OK;
}

it_status it_memory_empty_cache(it_device device) {
    IT_CHECK_DEVICE(device, "it_memory_empty_cache");
    if (device.type == IT_CUDA) {
        IT_CUDA_CALL("it_memory_empty_cache", it_cuda_memory_empty_cache, device);
        return IT_OK;
    }
    pthread_mutex_lock(&cpu_cache.lock);
    release_all_cached();
    pthread_mutex_unlock(&cpu_cache.lock);
#ifdef __GLIBC__
    /* blocks below glibc's mmap threshold went back to its heap, not to the system: trim it */
    malloc_trim(0);
#endif
    return IT_OK;
}

it_status it_memcpy(it_device dst_device, void *dst, it_device src_device, const void *src,
                    size_t nbytes) {
    IT_CHECK_DEVICE(dst_device, "it_memcpy");
    IT_CHECK_DEVICE(src_device, "it_memcpy");
    IT_CHECK_BYTES(nbytes, "it_memcpy");
    if (nbytes == 0) return IT_OK;
    IT_CHECK_PTR(dst, "it_memcpy");
    IT_CHECK_PTR(src, "it_memcpy");
    if (dst_device.type == IT_CUDA || src_device.type == IT_CUDA) {  /* either way, or between GPUs */
        IT_CUDA_CALL("it_memcpy", it_cuda_memcpy, dst_device, dst, src_device, src, nbytes);
        return IT_OK;
    }
    /* One call: glibc uses non-temporal stores for large copies, which a split into
     * per-thread pieces measured no faster than on this kind of machine. */
    memmove(dst, src, nbytes);
    return IT_OK;
}

it_status it_memcpy_async(it_device dst_device, void *dst, it_device src_device, const void *src,
                          size_t nbytes, it_stream *stream) {
    IT_CHECK_DEVICE(dst_device, "it_memcpy_async");
    IT_CHECK_DEVICE(src_device, "it_memcpy_async");
    IT_CHECK_BYTES(nbytes, "it_memcpy_async");
    if (nbytes == 0) return IT_OK;
    IT_CHECK_PTR(dst, "it_memcpy_async");
    IT_CHECK_PTR(src, "it_memcpy_async");
    if (dst_device.type != IT_CUDA && src_device.type != IT_CUDA)
        return it_memcpy(dst_device, dst, src_device, src, nbytes);
    IT_CHECK_ARG(dst_device.type != IT_CUDA || src_device.type != IT_CUDA || dst_device.index == src_device.index,
                 "it_memcpy_async: between two GPUs (cuda:%d to cuda:%d) use it_memcpy, which orders "
                 "both devices' streams", (int)src_device.index, (int)dst_device.index);
    it_device gpu = dst_device.type == IT_CUDA ? dst_device : src_device;
    IT_CHECK_ARG(!stream || (it_stream_device(stream).type == IT_CUDA &&
                             it_stream_device(stream).index == gpu.index),
                 "it_memcpy_async: the stream is not one of cuda:%d's", (int)gpu.index);
    IT_CUDA_CALL("it_memcpy_async", it_cuda_memcpy_async, dst_device, dst, src_device, src, nbytes,
                 it_stream_handle(stream));
    return IT_OK;
}
