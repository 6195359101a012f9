/* Errors: the thread-local message of it_last_error(), the argument checks every entry point makes
 * (status.c). Not part of the ABI. */
#ifndef IT_STATUS_H
#define IT_STATUS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "infinitrain.h"

/* Records a message for it_last_error() on this thread and returns `status`. */
it_status it_set_error(it_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define IT_REQUIRE(cond, status, ...)                                                        \
    do {                                                                                     \
        if (!(cond)) return it_set_error((status), __VA_ARGS__);                             \
    } while (0)
#define IT_CHECK_ARG(cond, ...) IT_REQUIRE(cond, IT_ERR_INVALID_ARGUMENT, __VA_ARGS__)
#define IT_CHECK_PTR(p, fn) IT_CHECK_ARG((p) != NULL, "%s: %s is NULL", fn, #p)
/* Sizes whose product (of all of them, each >= 0) stays at most 2^58: kernels multiply them
 * into element counts, byte counts and scratch sizes of a few buffers, which must not wrap
 * (a wrapped product means a heap overflow, or IT_OK for work never done). */
#define IT_MAX_ELEMENTS ((int64_t)1 << 58)
/* The one rule for every size argument: 0 <= x <= IT_MAX_ELEMENTS (a size alone; products of
 * several go through IT_CHECK_PRODUCT too). */
#define IT_CHECK_SIZE(x, fn)                                                                 \
    IT_CHECK_ARG((x) >= 0 && (x) <= IT_MAX_ELEMENTS, "%s: %s must be in [0, 2^58], got %lld", \
                 fn, #x, (long long)(x))
/* A window [start, start + count) inside [0, total), checked without forming start + count
 * (which wraps in int64 for a start near 2^63 and then passes a `start + count <= total` test). */
#define IT_CHECK_RANGE(start, count, total, fn)                                              \
    IT_CHECK_ARG((start) >= 0 && (count) >= 0 && (total) >= 0 && (start) <= (total) &&       \
                     (count) <= (total) - (start),                                           \
                 "%s: [%s, %s + %s) = [%lld, +%lld) falls outside [0, %lld)", fn, #start,     \
                 #start, #count, (long long)(start), (long long)(count), (long long)(total))
/* Byte counts (size_t): a negative size converted to size_t is above 2^63. */
#define IT_CHECK_BYTES(x, fn)                                                                \
    IT_CHECK_ARG((uint64_t)(x) <= ((uint64_t)IT_MAX_ELEMENTS << 3),                           \
                 "%s: %s = %llu bytes is beyond any buffer (a negative size?)", fn, #x,       \
                 (unsigned long long)(x))
/* Scalars a kernel computes with (learning rates, epsilons, steps): finite. */
#define IT_CHECK_FINITE(x, fn)                                                               \
    IT_CHECK_ARG(isfinite((double)(x)), "%s: %s must be finite, got %g", fn, #x, (double)(x))
/* 0/1 flags: anything else is a caller's mistake, not "true". */
#define IT_CHECK_FLAG(x, fn) IT_CHECK_ARG((x) == 0 || (x) == 1, "%s: %s must be 0 or 1, got %d", fn, #x, (int)(x))
/* Two buffers the header says must not be the same memory. */
#define IT_CHECK_NO_ALIAS(x, y, fn)                                                          \
    IT_CHECK_ARG((x) == NULL || (const void *)(x) != (const void *)(y),                      \
                 "%s: %s must not alias %s", fn, #x, #y)
it_status it_check_product(const char *fn, const int64_t *sizes, int n);
#define IT_CHECK_PRODUCT(fn, ...)                                                            \
    IT_TRY(it_check_product((fn), (const int64_t[]){__VA_ARGS__},                            \
                            (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))))
#define IT_TRY(expr)                                                                         \
    do {                                                                                     \
        it_status _st = (expr);                                                              \
        if (_st != IT_OK) return _st;                                                        \
    } while (0)

#endif
