// libnccl.so.2 for the emulated GPU: communicators of any number of ranks, one process each (the
// MPI ranks of a test on one machine), meeting through files in a folder named by the unique id.
//
// A collective runs when it is called: its stream's queued work runs first (so an event wait
// the caller queued before it is honoured, and a missing one shows as unwritten input), then
// each rank writes what it contributes to `<folder>/<call>.<rank>`, waits for the others' files
// and computes its result from them in rank order. Every rank makes the same calls in the same
// order on a communicator, as NCCL requires, so calls rendezvous like blocking MPI calls. A send
// is buffered (a file the receiver takes), so two ranks that both send first do not deadlock.
// A peer that never arrives is an error after INFINITRAIN_EMULATED_NCCL_TIMEOUT seconds (60).
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "emulated_cuda.h"

namespace {
const int kSystemError = 2, kInvalidArgument = 4, kInvalidUsage = 5;
enum { INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16 };
enum { SUM, PROD, MAX, MIN, AVG };

struct UniqueId {  // passed by value, as nccl.h declares it
    char internal[128];
};

struct Comm {
    int nranks, rank;
    std::string folder;
    uint64_t calls = 0;           // collectives so far
    std::vector<uint64_t> sent, received;  // point-to-point messages so far, per peer
};

thread_local char last_error[256];

size_t type_bytes(int t) {
    switch (t) {
    case INT8: case UINT8: return 1;
    case FLOAT16: case BFLOAT16: return 2;
    case INT32: case UINT32: case FLOAT32: return 4;
    default: return 8;
    }
}

double load(int t, const void *p, size_t i) {
    switch (t) {
    case INT8: return ((const int8_t *)p)[i];
    case UINT8: return ((const uint8_t *)p)[i];
    case INT32: return ((const int32_t *)p)[i];
    case UINT32: return ((const uint32_t *)p)[i];
    case INT64: return (double)((const int64_t *)p)[i];
    case UINT64: return (double)((const uint64_t *)p)[i];
    case FLOAT16: return (float)((const __half *)p)[i];
    case FLOAT32: return ((const float *)p)[i];
    case FLOAT64: return ((const double *)p)[i];
    default: return (float)((const __nv_bfloat16 *)p)[i];
    }
}

void store(int t, void *p, size_t i, double v) {
    switch (t) {
    case INT8: ((int8_t *)p)[i] = (int8_t)v; break;
    case UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case UINT32: ((uint32_t *)p)[i] = (uint32_t)v; break;
    case INT64: ((int64_t *)p)[i] = (int64_t)v; break;
    case UINT64: ((uint64_t *)p)[i] = (uint64_t)v; break;
    case FLOAT16: ((__half *)p)[i] = __float2half((float)v); break;
    case FLOAT32: ((float *)p)[i] = (float)v; break;
    case FLOAT64: ((double *)p)[i] = v; break;
    default: ((__nv_bfloat16 *)p)[i] = __float2bfloat16((float)v); break;
    }
}

// Reduces element i of each rank's contribution, in rank order, into out[i] (in the
// accumulation type of the data: float sums of 16-bit floats are rounded once, at the end).
void reduce(int t, int op, int nranks, const std::vector<std::vector<char>> &parts, size_t offset,
            void *out, size_t count) {
    for (size_t i = 0; i < count; i++) {
        double acc = load(t, parts[0].data(), offset + i);
        for (int r = 1; r < nranks; r++) {
            double v = load(t, parts[r].data(), offset + i);
            acc = op == PROD ? acc * v : op == MAX ? (v > acc ? v : acc) : op == MIN ? (v < acc ? v : acc)
                                                                                        : acc + v;
        }
        if (op == AVG) acc /= nranks;
        store(t, out, i, acc);
    }
}

bool write_file(const std::string &path, const void *data, size_t n) {
    std::string tmp = path + ".part";
    FILE *f = fopen(tmp.c_str(), "wb");
    if (!f) return false;
    bool ok = fwrite(data, 1, n, f) == n;
    ok &= fclose(f) == 0;
    return ok && rename(tmp.c_str(), path.c_str()) == 0;  // readers never see it half written
}

// Waits for `path` and reads it; false (with last_error set) after the timeout.
bool read_file(const std::string &path, std::vector<char> &out) {
    const char *env = getenv("INFINITRAIN_EMULATED_NCCL_TIMEOUT");
    double limit = env ? atof(env) : 60.0, waited = 0;
    for (int spins = 0;; spins++) {
        FILE *f = fopen(path.c_str(), "rb");
        if (f) {
            fseek(f, 0, SEEK_END);
            long n = ftell(f);
            fseek(f, 0, SEEK_SET);
            out.resize((size_t)n);
            bool ok = fread(out.data(), 1, out.size(), f) == out.size();
            fclose(f);
            return ok;
        }
        if (waited > limit) {
            snprintf(last_error, sizeof last_error, "emulated NCCL: no %s after %.0f s: a rank of the "
                     "communicator did not make the same call", path.c_str(), limit);
            return false;
        }
        usleep(spins < 100 ? 20 : 500);
        waited += spins < 100 ? 20e-6 : 500e-6;
    }
}

// Runs the stream's queued work, so that what the call reads has been written.
void catch_up(cudaStream_t stream) { cudaStreamSynchronize(stream); }

// One collective: this rank contributes `n` bytes, gets every rank's contribution back.
int exchange(Comm *c, const void *mine, size_t n, std::vector<std::vector<char>> &parts) {
    uint64_t call = c->calls++;
    std::string base = c->folder + "/" + std::to_string(call) + ".";
    if (!write_file(base + std::to_string(c->rank), mine, n)) return kSystemError;
    parts.assign(c->nranks, {});
    for (int r = 0; r < c->nranks; r++)
        if (!read_file(base + std::to_string(r), parts[r])) return kSystemError;
    // every rank has finished the previous call (it wrote this one): its file can go
    if (call > 0) unlink((c->folder + "/" + std::to_string(call - 1) + "." + std::to_string(c->rank)).c_str());
    return 0;
}

int check(Comm *c, int type, int op) {
    if (!c) return kInvalidArgument;
    if (type < INT8 || type > BFLOAT16 || op < SUM || op > AVG) return kInvalidArgument;
    return 0;
}
}  // namespace

extern "C" int ncclGetUniqueId(UniqueId *id) {
    memset(id, 0, sizeof *id);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(id->internal, sizeof id->internal, "emulated-nccl-%d-%lld-%ld", (int)getpid(),
             (long long)ts.tv_sec, ts.tv_nsec);
    return 0;
}

extern "C" int ncclCommInitRank(void **comm, int nranks, UniqueId id, int rank) {
    if (nranks < 1 || rank < 0 || rank >= nranks || strncmp(id.internal, "emulated-nccl-", 14))
        return kInvalidArgument;
    const char *root = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    Comm *c = new Comm{nranks, rank, std::string(root) + "/infinitrain-" + id.internal};
    mkdir(c->folder.c_str(), 0700);  // every rank tries; one makes it
    c->sent.assign(nranks, 0);
    c->received.assign(nranks, 0);
    *comm = c;
    return 0;
}

extern "C" int ncclCommDestroy(void *comm) {
    Comm *c = (Comm *)comm;
    if (!c) return kInvalidArgument;
    if (c->calls > 0) unlink((c->folder + "/" + std::to_string(c->calls - 1) + "." + std::to_string(c->rank)).c_str());
    rmdir(c->folder.c_str());  // succeeds for the last rank out
    delete c;
    return 0;
}

extern "C" const char *ncclGetErrorString(int result) {
    switch (result) {
    case 0: return "no error";
    case kSystemError: return last_error[0] ? last_error : "system error";
    case kInvalidArgument: return "invalid argument";
    case kInvalidUsage: return "invalid usage";
    default: return "unknown result";
    }
}

extern "C" int ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, void *comm,
                             cudaStream_t stream) {
    Comm *c = (Comm *)comm;
    if (int e = check(c, type, op)) return e;
    catch_up(stream);
    std::vector<std::vector<char>> parts;
    if (int e = exchange(c, send, count * type_bytes(type), parts)) return e;
    reduce(type, op, c->nranks, parts, 0, recv, count);
    return 0;
}

extern "C" int ncclAllGather(const void *send, void *recv, size_t count, int type, void *comm,
                             cudaStream_t stream) {
    Comm *c = (Comm *)comm;
    if (int e = check(c, type, SUM)) return e;
    catch_up(stream);
    std::vector<std::vector<char>> parts;
    size_t n = count * type_bytes(type);
    if (int e = exchange(c, send, n, parts)) return e;
    for (int r = 0; r < c->nranks; r++) memcpy((char *)recv + r * n, parts[r].data(), n);
    return 0;
}

extern "C" int ncclReduceScatter(const void *send, void *recv, size_t count, int type, int op, void *comm,
                                 cudaStream_t stream) {
    Comm *c = (Comm *)comm;
    if (int e = check(c, type, op)) return e;
    catch_up(stream);
    std::vector<std::vector<char>> parts;
    if (int e = exchange(c, send, count * c->nranks * type_bytes(type), parts)) return e;
    reduce(type, op, c->nranks, parts, count * c->rank, recv, count);
    return 0;
}

extern "C" int ncclBroadcast(const void *send, void *recv, size_t count, int type, int root, void *comm,
                             cudaStream_t stream) {
    Comm *c = (Comm *)comm;
    if (int e = check(c, type, SUM)) return e;
    if (root < 0 || root >= c->nranks) return kInvalidArgument;
    catch_up(stream);
    std::vector<std::vector<char>> parts;
    size_t n = count * type_bytes(type);
    if (int e = exchange(c, c->rank == root ? send : nullptr, c->rank == root ? n : 0, parts)) return e;
    memcpy(recv, parts[root].data(), n);
    return 0;
}

namespace {
// ncclGroupStart/End: the sends and receives called in between are held and run at the end,
// every send first (they are buffered), then every receive, so no receive waits on a send its
// peer has not made yet (NCCL runs a group's operations together).
struct PointToPoint {
    bool send;
    void *buf;
    size_t count;
    int type, peer;
    void *comm;
    cudaStream_t stream;
};
thread_local int group_depth = 0;
thread_local std::vector<PointToPoint> held;

int send_now(const void *send, size_t count, int type, int peer, void *comm, cudaStream_t stream);
int recv_now(void *recv, size_t count, int type, int peer, void *comm, cudaStream_t stream);
}  // namespace

extern "C" int ncclGroupStart() {
    ++group_depth;
    return 0;
}

extern "C" int ncclGroupEnd() {
    if (group_depth == 0) return kInvalidUsage;
    if (--group_depth > 0) return 0;
    std::vector<PointToPoint> ops;
    ops.swap(held);
    int failed = 0;
    for (int pass = 0; pass < 2 && !failed; ++pass)
        for (const PointToPoint &op : ops)
            if (!failed && op.send == (pass == 0))
                failed = op.send ? send_now(op.buf, op.count, op.type, op.peer, op.comm, op.stream)
                                 : recv_now(op.buf, op.count, op.type, op.peer, op.comm, op.stream);
    return failed;
}

extern "C" int ncclSend(const void *send, size_t count, int type, int peer, void *comm, cudaStream_t stream) {
    if (group_depth > 0) {
        held.push_back({true, (void *)send, count, type, peer, comm, stream});
        return 0;
    }
    return send_now(send, count, type, peer, comm, stream);
}

extern "C" int ncclRecv(void *recv, size_t count, int type, int peer, void *comm, cudaStream_t stream) {
    if (group_depth > 0) {
        held.push_back({false, recv, count, type, peer, comm, stream});
        return 0;
    }
    return recv_now(recv, count, type, peer, comm, stream);
}

namespace {
int send_now(const void *send, size_t count, int type, int peer, void *comm, cudaStream_t stream) {
    Comm *c = (Comm *)comm;
    if (int e = check(c, type, SUM)) return e;
    if (peer < 0 || peer >= c->nranks || peer == c->rank) return kInvalidArgument;
    catch_up(stream);
    std::string path = c->folder + "/p2p." + std::to_string(c->rank) + "." + std::to_string(peer) + "." +
                       std::to_string(c->sent[peer]++);
    return write_file(path, send, count * type_bytes(type)) ? 0 : kSystemError;
}

int recv_now(void *recv, size_t count, int type, int peer, void *comm, cudaStream_t stream) {
    Comm *c = (Comm *)comm;
    if (int e = check(c, type, SUM)) return e;
    if (peer < 0 || peer >= c->nranks || peer == c->rank) return kInvalidArgument;
    catch_up(stream);
    std::string path = c->folder + "/p2p." + std::to_string(peer) + "." + std::to_string(c->rank) + "." +
                       std::to_string(c->received[peer]++);
    std::vector<char> data;
    if (!read_file(path, data)) return kSystemError;
    if (data.size() != count * type_bytes(type)) {
        snprintf(last_error, sizeof last_error, "emulated NCCL: rank %d sent %zu bytes, rank %d receives %zu",
                 peer, data.size(), c->rank, count * type_bytes(type));
        return kSystemError;
    }
    memcpy(recv, data.data(), data.size());
    unlink(path.c_str());
    return 0;
}
}  // namespace
