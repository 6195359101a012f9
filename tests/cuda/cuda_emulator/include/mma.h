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
