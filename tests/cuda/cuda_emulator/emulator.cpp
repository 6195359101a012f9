// The emulated CUDA runtime: blocks of fibers, lazy streams, events, a caching memory pool.
// See include/emulated_cuda.h for what it models and why.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "emulated_cuda.h"

// ---- errors -------------------------------------------------------------------------------
// A kernel that breaks the programming model fails the way a faulting kernel does on a GPU:
// the error is sticky, every later call returns it, and its message says what happened.
static std::recursive_mutex big_lock;  // one host thread in the runtime at a time
static thread_local cudaError_t last_error = cudaSuccess;
static cudaError_t sticky_error = cudaSuccess;
static std::string sticky_message;
static const bool tracing = getenv("INFINITRAIN_EMULATED_CUDA_TRACE") != nullptr;  // every call, to stderr

static cudaError_t fail(cudaError_t e) {
    last_error = e;
    return e;
}
#define LOCKED std::lock_guard<std::recursive_mutex> guard_(big_lock); \
    if (sticky_error != cudaSuccess) return fail(sticky_error)

static void kernel_failed(const char *fmt, ...) {
    if (sticky_error != cudaSuccess) return;  // the first failure is the one to read
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    sticky_error = cudaErrorLaunchFailure;
    sticky_message = std::string("unspecified launch failure (emulated: ") + buf + ")";
    fprintf(stderr, "emulated CUDA: %s\n", buf);
}

extern "C" const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return sticky_message.empty() ? "unspecified launch failure"
                                                               : sticky_message.c_str();
    }
    return "unknown error";
}
extern "C" cudaError_t cudaGetLastError(void) {
    cudaError_t e = sticky_error != cudaSuccess ? sticky_error : last_error;
    last_error = cudaSuccess;
    return e;
}
extern "C" cudaError_t cudaPeekAtLastError(void) {
    return sticky_error != cudaSuccess ? sticky_error : last_error;
}

// ---- devices ------------------------------------------------------------------------------
static int device_count() {
    const char *env = getenv("INFINITRAIN_EMULATED_GPUS");
    int n = env ? atoi(env) : 1;
    return n < 0 ? 0 : n > 8 ? 8 : n;
}
static thread_local int current_device = 0;

extern "C" cudaError_t cudaGetDeviceCount(int *n) {
    *n = device_count();
    return *n ? cudaSuccess : fail(cudaErrorNoDevice);
}
extern "C" cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}
extern "C" cudaError_t cudaGetDevice(int *device) {
    *device = current_device;
    return cudaSuccess;
}
extern "C" cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device) {
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "emulated GPU %d (CPU)", device);
    p->major = 9;
    p->minor = 0;
    p->totalGlobalMem = (size_t)16 << 30;
    return cudaSuccess;
}
extern "C" cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = 13000;
    return cudaSuccess;
}

// ---- streams and events ----------------------------------------------------------------------
// A stream is a queue that runs only when something waits on it, up to what is waited for.
struct emu_stream {
    std::deque<std::function<void()>> queued;
    uint64_t enqueued = 0, done = 0;  // counts of tasks
};
struct emu_event {
    emu_stream *stream = nullptr;  // where it was last recorded (null: never)
    uint64_t at = 0;               // the stream's task count when recorded
};
static emu_stream legacy_stream;  // stream 0
static std::vector<emu_stream *> streams = {&legacy_stream};

static emu_stream *resolve(cudaStream_t s) { return s ? s : &legacy_stream; }

static void enqueue(cudaStream_t s, std::function<void()> task) {
    emu_stream *q = resolve(s);
    q->queued.push_back(std::move(task));
    q->enqueued++;
}

static void run_until(emu_stream *q, uint64_t count) {
    while (q->done < count && !q->queued.empty()) {
        std::function<void()> task = std::move(q->queued.front());
        q->queued.pop_front();
        q->done++;
        if (sticky_error == cudaSuccess) task();  // after a fault the queued work is dropped
    }
}
static void run_all(emu_stream *q) {
    if (tracing) fprintf(stderr, "emulated CUDA: run stream %p (%zu queued)\n", (void *)q, q->queued.size());
    run_until(q, q->enqueued);
}

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int) {
    LOCKED;
    *s = new emu_stream;
    streams.push_back(*s);
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s) {
    LOCKED;
    if (!s) return fail(cudaErrorInvalidValue);
    run_all(s);  // its queued work still completes, as on a GPU
    for (size_t i = 0; i < streams.size(); i++)
        if (streams[i] == s) streams.erase(streams.begin() + i);
    delete s;
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    LOCKED;
    run_all(resolve(s));
    return sticky_error != cudaSuccess ? fail(sticky_error) : cudaSuccess;
}
extern "C" cudaError_t cudaDeviceSynchronize(void) {
    LOCKED;
    for (size_t i = 0; i < streams.size(); i++) run_all(streams[i]);
    return sticky_error != cudaSuccess ? fail(sticky_error) : cudaSuccess;
}
extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int) {
    LOCKED;
    *e = new emu_event;
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e) {
    LOCKED;
    delete e;
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    LOCKED;
    e->stream = resolve(s);
    e->at = e->stream->enqueued;
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
    LOCKED;
    if (!e->stream) return cudaSuccess;
    emu_stream *from = e->stream;
    uint64_t at = e->at;  // the event as recorded now, whatever is recorded into it later
    if (from == resolve(s)) return cudaSuccess;
    enqueue(s, [from, at] { run_until(from, at); });
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    LOCKED;
    if (e->stream) run_until(e->stream, e->at);
    return sticky_error != cudaSuccess ? fail(sticky_error) : cudaSuccess;
}
// Asking is waiting here: the work an event marks is run when someone asks about it, so a
// host loop that polls until done finishes.
extern "C" cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }

// ---- memory -------------------------------------------------------------------------------
struct Allocation {
    size_t size;
    int device;
};
static std::map<uintptr_t, Allocation> live;  // device memory handed out, by address
struct emu_pool {
    std::multimap<size_t, void *> cached;  // freed blocks kept for reuse, by size
    uint64_t reserved = 0, reserved_high = 0;
};
static emu_pool pools[8];

// The allocation that holds [p, p + n), or null when that is not device memory.
static const Allocation *device_range(const void *p, size_t n) {
    auto it = live.upper_bound((uintptr_t)p);
    if (it == live.begin()) return nullptr;
    --it;
    uintptr_t start = it->first, end = start + it->second.size;
    if ((uintptr_t)p >= end) return nullptr;
    if ((uintptr_t)p + n > end) {
        kernel_failed("a copy of %zu bytes runs past the end of a %zu-byte allocation", n,
                      it->second.size);
        return nullptr;
    }
    return &it->second;
}

extern "C" cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t) {
    LOCKED;
    emu_pool &pool = pools[current_device];
    auto hit = pool.cached.find(n);
    if (hit != pool.cached.end()) {
        *p = hit->second;
        pool.cached.erase(hit);
    } else {
        if (!(*p = malloc(n))) return fail(cudaErrorMemoryAllocation);
        pool.reserved += n;
        if (pool.reserved > pool.reserved_high) pool.reserved_high = pool.reserved;
    }
    memset(*p, 0xff, n);  // NaN in every float type: a read of unwritten memory shows
    if (tracing) fprintf(stderr, "emulated CUDA: malloc %zu -> %p\n", n, *p);
    live[(uintptr_t)*p] = Allocation{n, current_device};
    return cudaSuccess;
}
extern "C" cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
    LOCKED;
    auto it = live.find((uintptr_t)p);
    if (it == live.end()) return fail(cudaErrorInvalidValue);
    Allocation a = it->second;
    live.erase(it);
    if (tracing) fprintf(stderr, "emulated CUDA: queue free %p on stream %p\n", p, (void *)resolve(s));
    // the block is reusable once the stream's earlier work (which may read it) has run
    enqueue(s, [p, a] {
        memset(p, 0xff, a.size);
        pools[a.device].cached.emplace(a.size, p);
    });
    return cudaSuccess;
}
extern "C" cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device) {
    if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
    *pool = &pools[device];
    return cudaSuccess;
}
extern "C" cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void *value) {
    LOCKED;
    if (attr == cudaMemPoolAttrReservedMemHigh) pool->reserved_high = pool->reserved;
    return cudaSuccess;
}
extern "C" cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, cudaMemPoolAttr attr, void *value) {
    LOCKED;
    if (attr == cudaMemPoolAttrReservedMemCurrent) *(uint64_t *)value = pool->reserved;
    else if (attr == cudaMemPoolAttrReservedMemHigh) *(uint64_t *)value = pool->reserved_high;
    else return fail(cudaErrorInvalidValue);
    return cudaSuccess;
}
extern "C" cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep) {
    LOCKED;
    for (auto &c : pool->cached) {
        pool->reserved -= c.first;
        free(c.second);
    }
    pool->cached.clear();
    return cudaSuccess;
}

// Pinned host memory: the copy engine reads and writes it when the copy runs, not at the call.
static std::map<uintptr_t, size_t> pinned;  // by address

static bool pinned_range(const void *p, size_t n) {
    auto it = pinned.upper_bound((uintptr_t)p);
    if (it == pinned.begin()) return false;
    --it;
    return (uintptr_t)p + n <= it->first + it->second;
}

extern "C" cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int) {
    LOCKED;
    if (!(*p = malloc(n ? n : 1))) return fail(cudaErrorMemoryAllocation);
    memset(*p, 0xff, n);  // NaN: as uninitialised as any new memory
    pinned[(uintptr_t)*p] = n;
    return cudaSuccess;
}
extern "C" cudaError_t cudaFreeHost(void *p) {
    LOCKED;
    auto it = pinned.find((uintptr_t)p);
    if (it == pinned.end()) return fail(cudaErrorInvalidValue);
    // a copy still queued to or from it would touch freed memory, as on a GPU: make it show
    for (size_t i = 0; i < streams.size(); i++) run_all(streams[i]);
    pinned.erase(it);
    free(p);
    return cudaSuccess;
}

// Copies and fills are queued like kernels. What a copy reads from pageable host memory is taken
// at the call, as the runtime stages it before it returns; pinned host memory is read (and
// written) only when the copy runs, so a host that reuses it too early sees the race.
extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind, cudaStream_t s) {
    LOCKED;
    if (!n) return cudaSuccess;
    bool dst_dev = device_range(dst, n) != nullptr, src_dev = device_range(src, n) != nullptr;
    if (tracing) fprintf(stderr, "emulated CUDA: copy %zu bytes %p%s -> %p%s on stream %p\n", n, src,
                         src_dev ? " (device)" : "", dst, dst_dev ? " (device)" : "", (void *)resolve(s));
    if (sticky_error != cudaSuccess) return fail(sticky_error);
    if (!src_dev && pinned_range(src, n) && dst_dev) {
        enqueue(s, [dst, src, n] { memcpy(dst, src, n); });
        return cudaSuccess;
    }
    if (!src_dev) {
        if (!dst_dev) {
            memcpy(dst, src, n);
            return cudaSuccess;
        }
        std::vector<char> staged((const char *)src, (const char *)src + n);
        enqueue(s, [dst, staged] { memcpy(dst, staged.data(), staged.size()); });
        return cudaSuccess;
    }
    enqueue(s, [dst, src, n] { memmove(dst, src, n); });
    return cudaSuccess;
}
extern "C" cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s) {
    LOCKED;
    if (!n) return cudaSuccess;
    if (!device_range(p, n)) return fail(sticky_error != cudaSuccess ? sticky_error : cudaErrorInvalidValue);
    enqueue(s, [p, value, n] { memset(p, value, n); });
    return cudaSuccess;
}

// ---- blocks of fibers -------------------------------------------------------------------------
// Each CUDA thread of a block is a fiber on the host thread that runs the block. A fiber runs
// until it reaches a barrier (__syncthreads, or a shuffle: a barrier of its warp) or ends;
// the scheduler then releases every warp whose live lanes all wait at a shuffle, and the block
// when all its live threads wait at __syncthreads.
// Switching fibers: save the callee-saved registers on this stack, store its pointer in *from,
// load `to` and pop the registers saved there (System V x86-64). A new fiber's stack is laid
// out so that its first switch "returns" into fiber_start. Tens of nanoseconds a switch,
// against a system call for ucontext's swapcontext: a kernel of a million threads is fast.
#if !defined(__x86_64__)
#error "the emulated GPU switches fibers with x86-64 code; port switch_stack for this machine"
#endif
extern "C" void emu_switch_stack(void **from, void *to);
asm(R"(
    .text
    .globl emu_switch_stack
    .hidden emu_switch_stack
    .type emu_switch_stack, @function
emu_switch_stack:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch_stack, .-emu_switch_stack
)");

namespace emu {
struct Block {
    std::vector<Fiber> fibers;
    std::vector<unsigned char> shared;  // dynamic shared memory
    std::vector<uint64_t> slots;  // two rounds of [warps][32] shuffle values
    void *scheduler;  // the stack pointer of the scheduler while a fiber runs
    const std::function<void()> *body = nullptr;
    const char *kernel = "";
    bool failed = false;
};
static constexpr size_t kStack = 64 << 10;
// Kernels run one at a time, under big_lock, whichever host thread drives the queue.
Fiber *current;
uint3 block_index;
dim3 block_size, grid_size;
static Block *block;
// A thread needs a stack of its own only while it waits at a barrier: one that ends without
// waiting leaves its stack to the next, so a kernel without barriers runs on one hot stack.
static std::vector<char *> free_stacks;


uint64_t shuffle(unsigned int mask, uint64_t value, int source);

static void yield(State s) {
    current->state = s;
    emu_switch_stack(&current->stack_pointer, block->scheduler);
}

// Stops this thread for good (the kernel failed); the scheduler never resumes it.
static void abandon() {
    block->failed = true;
    yield(DONE);
}

void sync_block() { yield(AT_SYNCTHREADS); }

void sync_warp() { shuffle(0xffffffffu, 0, 0); }

const char *kernel_name() { return block ? block->kernel : ""; }

void fail(const char *message) {
    kernel_failed("%s: %s", block->kernel, message);
    abandon();
}

uint64_t shuffle(unsigned int mask, uint64_t value, int source) {
    if (mask != 0xffffffffu) {
        kernel_failed("%s: a shuffle with mask %#x: only full-warp shuffles are used here", block->kernel, mask);
        abandon();
    }
    size_t warps = block->slots.size() / 64, parity = current->shuffles++ & 1;
    uint64_t *slots = &block->slots[(parity * warps + current->warp) * 32];
    slots[current->lane] = value;
    yield(AT_SHUFFLE);
    return slots[source & 31];
}

static void fiber_start() {
    (*block->body)();
    yield(DONE);  // never resumed
}

// A stack whose first switch pops six zero registers and returns into fiber_start with the
// alignment of a called function.
static void *new_fiber_stack(char *stack) {
    uintptr_t top = ((uintptr_t)stack + kStack) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = nullptr;                // fiber_start's return address: it never returns
    *--sp = (void *)&fiber_start;  // where the first switch returns to
    for (int r = 0; r < 6; r++) *--sp = nullptr;
    return sp;
}

static void schedule(Block &b);

static void run_block(Block &b) {
    schedule(b);
    for (Fiber &f : b.fibers)  // a failed block leaves threads waiting
        if (f.stack) {
            free_stacks.push_back(f.stack);
            f.stack = nullptr;
        }
}

static void schedule(Block &b) {
    size_t n = (size_t)block_size.x * block_size.y * block_size.z;
    b.fibers.resize(n);
    size_t warps = (n + 31) / 32;
    b.slots.resize(2 * warps * 32);  // each written before it is read
    uint3 at = {0, 0, 0};  // threadIdx of thread t, x fastest
    for (size_t t = 0; t < n; t++) {
        Fiber &f = b.fibers[t];
        f.index = at;
        if (++at.x == block_size.x) {
            at.x = 0;
            if (++at.y == block_size.y) {
                at.y = 0;
                at.z++;
            }
        }
        f.lane = (int)(t & 31);
        f.warp = (int)(t >> 5);
        f.state = RUNNABLE;
        f.shuffles = 0;
        f.stack = nullptr;
    }
    for (;;) {
        for (size_t t = 0; t < n; t++) {
            Fiber &f = b.fibers[t];
            if (f.state != RUNNABLE) continue;
            if (!f.stack) {
                if (free_stacks.empty()) free_stacks.push_back((char *)malloc(kStack));
                f.stack = free_stacks.back();
                free_stacks.pop_back();
                f.stack_pointer = new_fiber_stack(f.stack);
            }
            current = &f;
            emu_switch_stack(&b.scheduler, f.stack_pointer);
            if (b.failed) return;
            if (f.state == DONE) {
                free_stacks.push_back(f.stack);
                f.stack = nullptr;
            }
        }
        bool released = false, all_done = true, all_at_barrier = true;
        for (size_t w = 0; w < warps; w++) {
            size_t first = w * 32, last = first + 32 < n ? first + 32 : n;
            int shuffling = 0, exited = 0;
            for (size_t t = first; t < last; t++) {
                shuffling += b.fibers[t].state == AT_SHUFFLE;
                exited += b.fibers[t].state == DONE;
            }
            if (!shuffling) continue;
            if (last - first < 32 || exited) {
                kernel_failed("%s: a full-warp shuffle in warp %zu of a block of %zu threads, which "
                              "has only %zu live lanes", b.kernel, w, n, last - first - exited);
                b.failed = true;
                return;
            }
            if (shuffling == (int)(last - first)) {
                for (size_t t = first; t < last; t++) b.fibers[t].state = RUNNABLE;
                released = true;
            }
        }
        if (released) continue;
        for (size_t t = 0; t < n; t++) {
            all_done &= b.fibers[t].state == DONE;
            all_at_barrier &= b.fibers[t].state == DONE || b.fibers[t].state == AT_SYNCTHREADS;
        }
        if (all_done) return;
        if (!all_at_barrier) {
            kernel_failed("%s: block (%u,%u,%u) deadlocks: some threads wait at __syncthreads() "
                          "while others of the same warp wait at a shuffle", b.kernel, block_index.x,
                          block_index.y, block_index.z);
            b.failed = true;
            return;
        }
        for (size_t t = 0; t < n; t++)
            if (b.fibers[t].state == AT_SYNCTHREADS) b.fibers[t].state = RUNNABLE;
    }
}

void enqueue_task(cudaStream_t stream, std::function<void()> task) {
    std::lock_guard<std::recursive_mutex> guard(big_lock);
    if (sticky_error == cudaSuccess) enqueue(stream, std::move(task));
}

static std::map<const void *, int> shared_allowed;  // cudaFuncAttributeMaxDynamicSharedMemorySize

extern "C" cudaError_t emu_func_set_attribute(const void *kernel, cudaFuncAttribute attribute, int value) {
    std::lock_guard<std::recursive_mutex> guard(big_lock);
    if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > 227 * 1024)
        return last_error = cudaErrorInvalidValue;
    shared_allowed[kernel] = value;
    return cudaSuccess;
}

unsigned char *dynamic_shared() { return block->shared.data(); }
size_t dynamic_shared_bytes() { return block->shared.size(); }

void launch_grid(const char *name, const void *kernel, dim3 grid, dim3 threads, size_t shared_bytes,
                 cudaStream_t stream, std::function<void()> thread_body) {
    std::lock_guard<std::recursive_mutex> guard(big_lock);
    size_t allowed = 48 * 1024;  // more only where the kernel asked (cudaFuncSetAttribute), as on a GPU
    if (shared_allowed.count(kernel)) allowed = std::max(allowed, (size_t)shared_allowed[kernel]);
    size_t per_block = (size_t)threads.x * threads.y * threads.z;
    // the limits of every GPU since compute capability 3.0
    if (per_block == 0 || per_block > 1024 || threads.z > 64 || grid.x == 0 || grid.y == 0 ||
        grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535 ||
        shared_bytes > allowed) {
        fprintf(stderr, "emulated CUDA: invalid launch of %s: grid (%u,%u,%u), block (%u,%u,%u), %zu "
                "bytes of shared memory\n", name, grid.x, grid.y, grid.z, threads.x, threads.y, threads.z,
                shared_bytes);
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    if (sticky_error != cudaSuccess) return;
    if (tracing) fprintf(stderr, "emulated CUDA: queue %s on stream %p\n", name, (void *)resolve(stream));
    enqueue(stream, [name, grid, threads, shared_bytes, thread_body] {
        if (tracing) fprintf(stderr, "emulated CUDA: run %s (%u blocks of %u)\n", name, grid.x, threads.x);
        Block b;
        b.kernel = name;
        b.body = &thread_body;
        Block *outer = block;
        block = &b;
        grid_size = grid;
        block_size = threads;
        for (unsigned z = 0; z < grid.z && !b.failed; z++)
            for (unsigned y = 0; y < grid.y && !b.failed; y++)
                for (unsigned x = 0; x < grid.x && !b.failed; x++) {
                    block_index = uint3{x, y, z};
                    b.shared.assign(shared_bytes, 0xff);
                    run_block(b);
                }
        block = outer;
    });
}
}  // namespace emu
