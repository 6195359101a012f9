// libnccl.so.2 for the emulated GPU: communicators of one rank, where each collective is a
// copy queued on its stream (a sum, mean, max, min or product over one rank is its input).
// A communicator of several ranks is refused with ncclInvalidUsage: what crosses processes is
// tested on the CPU path over MPI, and on real GPUs.
#include <stdio.h>

#include "emulated_cuda.h"

namespace {
struct Comm {
    int nranks, rank;
};
const int kInvalidArgument = 4, kInvalidUsage = 5;

size_t type_bytes(int t) {
    switch (t) {
    case 0: case 1: return 1;   // int8, uint8
    case 2: case 3: case 7: return 4;  // int32, uint32, float32
    case 6: case 9: return 2;   // float16, bfloat16
    default: return 8;          // int64, uint64, float64
    }
}
int copy(const void *send, void *recv, size_t count, int type, cudaStream_t stream) {
    if (type < 0 || type > 9) return kInvalidArgument;
    size_t n = count * type_bytes(type);
    if (send != recv && n) emu::enqueue_task(stream, [=] { memmove(recv, send, n); });
    return 0;
}
}  // namespace

extern "C" int ncclGetUniqueId(void *id) {
    memset(id, 0, 128);
    snprintf((char *)id, 128, "emulated-nccl");
    return 0;
}
struct UniqueId {  // passed by value, as nccl.h declares it
    char internal[128];
};
extern "C" int ncclCommInitRank(void **comm, int nranks, UniqueId id, int rank) {
    if (nranks != 1) return kInvalidUsage;
    if (rank != 0) return kInvalidArgument;
    *comm = new Comm{nranks, rank};
    return 0;
}
extern "C" int ncclCommDestroy(void *comm) {
    delete (Comm *)comm;
    return 0;
}
extern "C" const char *ncclGetErrorString(int result) {
    switch (result) {
    case 0: return "no error";
    case kInvalidArgument: return "invalid argument";
    case kInvalidUsage: return "invalid usage (the emulated NCCL has communicators of one rank only)";
    default: return "unknown result";
    }
}
extern "C" int ncclAllReduce(const void *s, void *r, size_t count, int type, int op, void *, cudaStream_t st) {
    return op < 0 || op > 4 ? kInvalidArgument : copy(s, r, count, type, st);
}
extern "C" int ncclAllGather(const void *s, void *r, size_t count, int type, void *, cudaStream_t st) {
    return copy(s, r, count, type, st);
}
extern "C" int ncclReduceScatter(const void *s, void *r, size_t count, int type, int op, void *, cudaStream_t st) {
    return op < 0 || op > 4 ? kInvalidArgument : copy(s, r, count, type, st);
}
extern "C" int ncclBroadcast(const void *s, void *r, size_t count, int type, int root, void *, cudaStream_t st) {
    return root != 0 ? kInvalidArgument : copy(s, r, count, type, st);
}
// A rank may not send to itself without a matching receive in the same group; one rank has
// no peer, so both are refused.
extern "C" int ncclSend(const void *, size_t, int, int, void *, cudaStream_t) { return kInvalidUsage; }
extern "C" int ncclRecv(void *, size_t, int, int, void *, cudaStream_t) { return kInvalidUsage; }
