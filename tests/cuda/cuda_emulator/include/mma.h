// nvcuda::wmma, the warp matrix functions of <mma.h>, on the emulated GPU (16 x 16 x 16 tiles of
// 16-bit floats with float accumulators: the shape the attention kernels use).
//
// A fragment holds 8 elements per lane. Which element of the tile a lane holds is unspecified by
// CUDA; here it is the register layout of the PTX instruction mma.m16n8k16 (PTX ISA, "Matrix
// Fragments for mma.m16n8k16"), so code that assumes nothing but "fragments of one type share
// one layout" runs the same on both. Every function is warp-collective as on the hardware: a
// lane that calls one while the rest of its warp does not deadlocks (reported as a failed
// launch), and mma_sync meets the whole warp twice (all operands gathered, all results read).
// Pointers must be 256-bit aligned and ldm a multiple of 16 bytes, or the launch fails, as the
// programming guide requires. Sums run in k order in float32; tensor cores add in an order of
// their own, so tests compare with a tolerance.
#pragma once
#include "emulated_cuda.h"

#include <map>
#include <string.h>
#include <vector>

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulated WMMA has the 16x16x16 shape only");
    enum { num_elements = 8 };
    T x[8];
};

namespace detail {
// (row, column) of element e of lane l in an A or accumulator tile, and (k, n) in a B tile
inline void a_at(int l, int e, int &r, int &c) {
    r = (l >> 2) + 8 * ((e >> 1) & 1);
    c = 2 * (l & 3) + (e & 1) + 8 * (e >> 2);
}
inline void b_at(int l, int e, int &k, int &n) {
    k = 2 * (l & 3) + (e & 1) + 8 * ((e >> 1) & 1);
    n = (l >> 2) + 8 * (e >> 2);
}
template <typename T> void check(const T *p, unsigned ldm, const char *fn) {
    if ((uintptr_t)p % 32) emu::fail("a wmma pointer that is not 256-bit aligned");
    if ((ldm * sizeof(T)) % 16) emu::fail("a wmma ldm that is not a multiple of 16 bytes");
    (void)fn;
}
inline bool row_major_layout(row_major) { return true; }
inline bool row_major_layout(col_major) { return false; }
// one warp's operands while its lanes meet in mma_sync: blocks run one at a time
struct Staging {
    float a[16][16], b[16][16];
};
inline Staging &staging(int warp) {
    static Staging s[32];
    return s[warp];
}
}  // namespace detail

template <typename T, typename L> void load_matrix_sync(fragment<matrix_a, 16, 16, 16, T, L> &f, const T *p, unsigned ldm) {
    detail::check(p, ldm, "load_matrix_sync");
    bool rm = detail::row_major_layout(L());
    for (int e = 0; e < 8; e++) {
        int r, c;
        detail::a_at(emu::lane(), e, r, c);
        f.x[e] = rm ? p[r * ldm + c] : p[c * ldm + r];
    }
    emu::sync_warp();
}
template <typename T, typename L> void load_matrix_sync(fragment<matrix_b, 16, 16, 16, T, L> &f, const T *p, unsigned ldm) {
    detail::check(p, ldm, "load_matrix_sync");
    bool rm = detail::row_major_layout(L());
    for (int e = 0; e < 8; e++) {
        int k, n;
        detail::b_at(emu::lane(), e, k, n);
        f.x[e] = rm ? p[k * ldm + n] : p[n * ldm + k];
    }
    emu::sync_warp();
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float> &f, const float *p, unsigned ldm, layout_t layout) {
    detail::check(p, ldm, "load_matrix_sync");
    for (int e = 0; e < 8; e++) {
        int r, c;
        detail::a_at(emu::lane(), e, r, c);
        f.x[e] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
    }
    emu::sync_warp();
}
inline void store_matrix_sync(float *p, const fragment<accumulator, 16, 16, 16, float> &f, unsigned ldm, layout_t layout) {
    detail::check(p, ldm, "store_matrix_sync");
    for (int e = 0; e < 8; e++) {
        int r, c;
        detail::a_at(emu::lane(), e, r, c);
        (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.x[e];
    }
    emu::sync_warp();
}
template <typename Use, typename T, typename L, typename V> void fill_fragment(fragment<Use, 16, 16, 16, T, L> &f, const V &v) {
    for (int e = 0; e < 8; e++) f.x[e] = v;
    emu::sync_warp();
}
template <typename T, typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float> &d, const fragment<matrix_a, 16, 16, 16, T, LA> &a,
              const fragment<matrix_b, 16, 16, 16, T, LB> &b, const fragment<accumulator, 16, 16, 16, float> &c) {
    detail::Staging &s = detail::staging(emu::current->warp);
    int l = emu::lane();
    for (int e = 0; e < 8; e++) {
        int r, col;
        detail::a_at(l, e, r, col);
        s.a[r][col] = (float)a.x[e];
        detail::b_at(l, e, r, col);
        s.b[r][col] = (float)b.x[e];
    }
    emu::sync_warp();  // every lane's operands are in
    float out[8];
    for (int e = 0; e < 8; e++) {
        int r, col;
        detail::a_at(l, e, r, col);
        float sum = c.x[e];
        for (int k = 0; k < 16; k++) sum += s.a[r][k] * s.b[k][col];
        out[e] = sum;
    }
    emu::sync_warp();  // every lane has read them before any lane stages its next product
    for (int e = 0; e < 8; e++) d.x[e] = out[e];
}
}  // namespace wmma
}  // namespace nvcuda

// The PTX building blocks of native/src/cuda/mma.cuh (mma.sync.m16n8k16, ldmatrix, cp.async) in
// the layouts the PTX ISA documents, each warp-collective as on the hardware. cp.async is
// deferred: a copy lands in shared memory only when its thread waits for its group, and the
// destination reads as NaN from the issue on, so a kernel that reads a tile it has not waited
// for, or one another warp has started to refill, reads garbage instead of luckily right values.
namespace emu_ptx {
struct Staging {
    float a[16][16], b[16][8];
    const unsigned char *rows[32];
};
inline Staging &staging(int warp) {
    static Staging s[32];
    return s[warp];
}
template <typename T> float value(uint32_t reg, int half) {
    uint16_t bits = (uint16_t)(reg >> (16 * half));
    T x;
    memcpy(&x, &bits, 2);
    return (float)x;
}
inline uint32_t pair(const unsigned char *lo, const unsigned char *hi) {
    uint16_t a, b;
    memcpy(&a, lo, 2);
    memcpy(&b, hi, 2);
    return (uint32_t)a | ((uint32_t)b << 16);
}
struct Copy {
    unsigned char *dst;
    const unsigned char *src;
    bool valid;
};
struct Pending {  // one thread's committed groups, oldest first, and the group being formed
    const char *kernel = nullptr;
    uint3 block{0, 0, 0};
    std::vector<std::vector<Copy>> groups;
    std::vector<Copy> open;
};
inline Pending &pending() {
    static std::map<const void *, Pending> all;
    Pending &p = all[emu::current];
    uint3 b = emu::block_index;
    if (p.kernel != emu::kernel_name() || p.block.x != b.x || p.block.y != b.y || p.block.z != b.z)
        p = Pending{emu::kernel_name(), b, {}, {}};  // a new block on this fiber: nothing is in flight
    return p;
}
}  // namespace emu_ptx

inline uint32_t shared_address(const void *p) { return (uint32_t)(uintptr_t)p; }

namespace emu_ptx {
// In a kernel with dynamic shared memory (the ones built on these instructions), 16 bytes at p
// must lie inside it: a GPU's shared window is the block's, and a generic address outside it is
// undefined behaviour there (here, a silent read of host memory)
inline bool in_shared(const void *p) {
    const unsigned char *base = emu::dynamic_shared(), *q = (const unsigned char *)p;
    return emu::dynamic_shared_bytes() == 0 || (q >= base && q + 16 <= base + emu::dynamic_shared_bytes());
}
inline bool touches_shared(const void *p) {
    const unsigned char *base = emu::dynamic_shared(), *q = (const unsigned char *)p;
    return emu::dynamic_shared_bytes() && q + 16 > base && q < base + emu::dynamic_shared_bytes();
}
}  // namespace emu_ptx

template <typename T> void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    emu_ptx::Staging &s = emu_ptx::staging(emu::current->warp);
    const int l = emu::lane(), g = l >> 2, t = l & 3;
    for (int h = 0; h < 2; h++) {
        s.a[g][2 * t + h] = emu_ptx::value<T>(a[0], h);
        s.a[g + 8][2 * t + h] = emu_ptx::value<T>(a[1], h);
        s.a[g][2 * t + 8 + h] = emu_ptx::value<T>(a[2], h);
        s.a[g + 8][2 * t + 8 + h] = emu_ptx::value<T>(a[3], h);
        s.b[2 * t + h][g] = emu_ptx::value<T>(b0, h);
        s.b[2 * t + 8 + h][g] = emu_ptx::value<T>(b1, h);
    }
    emu::sync_warp();  // every lane's operands are in
    float out[4];
    for (int e = 0; e < 4; e++) {
        int r = g + 8 * (e >> 1), c = 2 * t + (e & 1);
        float sum = d[e];
        for (int k = 0; k < 16; k++) sum += s.a[r][k] * s.b[k][c];
        out[e] = sum;
    }
    emu::sync_warp();  // every lane has read them before any lane stages its next product
    for (int e = 0; e < 4; e++) d[e] = out[e];
}

inline void ldmatrix(uint32_t (&r)[4], const void *row, bool trans) {
    if ((uintptr_t)row % 16) emu::fail("an ldmatrix row address that is not 16-byte aligned");
    if (!emu_ptx::in_shared(row)) emu::fail("an ldmatrix row outside the block's shared memory");
    emu_ptx::Staging &s = emu_ptx::staging(emu::current->warp);
    const int l = emu::lane(), g = l >> 2, t = l & 3;
    s.rows[l] = (const unsigned char *)row;
    emu::sync_warp();  // every lane's row address is in
    for (int i = 0; i < 4; i++) {
        const unsigned char *const *m = s.rows + 8 * i;  // tile i's eight rows of 8 values
        r[i] = trans ? emu_ptx::pair(m[2 * t] + 2 * g, m[2 * t + 1] + 2 * g)
                     : emu_ptx::pair(m[g] + 4 * t, m[g] + 4 * t + 2);
    }
    emu::sync_warp();
}
inline void ldmatrix_x4(uint32_t (&r)[4], const void *row) { ldmatrix(r, row, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void *row) { ldmatrix(r, row, true); }

inline void cp_async16(void *dst, const void *src, bool valid) {
    if ((uintptr_t)dst % 16 || (uintptr_t)src % 16) emu::fail("a cp.async of 16 bytes that is not 16-byte aligned");
    if (!emu_ptx::in_shared(dst)) emu::fail("a cp.async to an address outside the block's shared memory");
    if (emu_ptx::touches_shared(src)) emu::fail("a cp.async from shared memory (its source must be global)");
    // the destination is garbage (NaN) from the issue until the wait: a warp still reading a stage
    // that another has started to refill reads NaN here, not the old values a GPU might still show
    memset(dst, 0xff, 16);
    emu_ptx::pending().open.push_back({(unsigned char *)dst, (const unsigned char *)src, valid});
}
inline void cp_async_commit() {
    emu_ptx::Pending &p = emu_ptx::pending();
    p.groups.push_back(std::move(p.open));
    p.open.clear();
}
template <int N> void cp_async_wait() {
    emu_ptx::Pending &p = emu_ptx::pending();
    while ((int)p.groups.size() > N) {
        for (const emu_ptx::Copy &c : p.groups.front()) {
            if (c.valid) memcpy(c.dst, c.src, 16);
            else memset(c.dst, 0, 16);
        }
        p.groups.erase(p.groups.begin());
    }
}
