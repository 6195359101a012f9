/* Errors and the size checks of every entry point. */
#include <stdarg.h>
#include <stdio.h>

#include "status.h"

/* ---- errors --------------------------------------------------------------------------- */
static _Thread_local char it_error_message[1024] = "";

it_status it_set_error(it_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(it_error_message, sizeof it_error_message, fmt, ap);
    va_end(ap);
    return status;
}

const char *it_last_error(void) { return it_error_message; }

const char *it_status_name(it_status status) {
    switch (status) {
    case IT_OK: return "IT_OK";
    case IT_ERR_INVALID_ARGUMENT: return "IT_ERR_INVALID_ARGUMENT";
    case IT_ERR_OUT_OF_MEMORY: return "IT_ERR_OUT_OF_MEMORY";
    case IT_ERR_NOT_SUPPORTED: return "IT_ERR_NOT_SUPPORTED";
    case IT_ERR_NO_CUDA: return "IT_ERR_NO_CUDA";
    case IT_ERR_INDEX_OUT_OF_RANGE: return "IT_ERR_INDEX_OUT_OF_RANGE";
    case IT_ERR_INTERNAL: return "IT_ERR_INTERNAL";
    case IT_ERR_CUDA: return "IT_ERR_CUDA";
    case IT_ERR_NCCL: return "IT_ERR_NCCL";
    }
    return "IT_ERR_UNKNOWN";
}

it_status it_check_product(const char *fn, const int64_t *sizes, int n) {
    int64_t total = 1;
    for (int i = 0; i < n; i++) {
        IT_CHECK_ARG(sizes[i] >= 0, "%s: size %d is negative (%lld)", fn, i, (long long)sizes[i]);
        if (sizes[i] == 0) return IT_OK;
    }
    for (int i = 0; i < n; i++) {
        IT_CHECK_ARG(!__builtin_mul_overflow(total, sizes[i], &total) && total <= IT_MAX_ELEMENTS,
                     "%s: the sizes multiply past %lld elements (size %d is %lld): too large",
                     fn, (long long)IT_MAX_ELEMENTS, i, (long long)sizes[i]);
    }
    return IT_OK;
}
