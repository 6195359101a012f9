/* Errors: the thread-local message of it_last_error(), the argument checks every entry point makes
 * (status.c). Not part of the ABI. */
#ifndef IT_STATUS_H
#define IT_STATUS_H

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
#define IT_CHECK_SIZE(x, fn) IT_CHECK_ARG((x) >= 0, "%s: %s must be >= 0, got %lld", fn, #x, \
                                          (long long)(x))
/* Sizes whose product (of all of them, each >= 0) stays at most 2^58: kernels multiply them
 * into element counts, byte counts and scratch sizes of a few buffers, which must not wrap
 * (a wrapped product means a heap overflow, or IT_OK for work never done). */
#define IT_MAX_ELEMENTS ((int64_t)1 << 58)
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
