/* Aligned scratch memory for kernels, from the caching allocator (scratch.c). Not part of the ABI. */
#ifndef IT_SCRATCH_H
#define IT_SCRATCH_H

#include <stddef.h>

void *it_scratch_alloc(size_t nbytes);
void it_scratch_free(void *p);

#endif
