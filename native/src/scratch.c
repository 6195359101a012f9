/* Scratch memory for kernels. */
#include <string.h>

#include "infinitrain.h"
#include "scratch.h"

/* Scratch comes from the caching allocator too (a large temporary freed every call would
 * otherwise be mapped and faulted in every call); the owning storage sits just before the
 * returned pointer, which stays 64-byte aligned. */
void *it_scratch_alloc(size_t nbytes) {
    it_storage *s = NULL;
    it_device cpu = {IT_CPU, 0};
    if (it_storage_new(cpu, nbytes + 64, &s) != IT_OK) return NULL;
    char *p = (char *)it_storage_data(s) + 64;
    memcpy(p - sizeof s, &s, sizeof s);
    return p;
}
void it_scratch_free(void *p) {
    if (!p) return;
    it_storage *s;
    memcpy(&s, (char *)p - sizeof s, sizeof s);
    it_storage_free(s);
}
