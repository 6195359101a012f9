// NCCL, opened at run time by its soname (libnccl.so.2, from the nvidia-nccl wheel) like
// cuBLAS, so that this library builds and loads without it.
#include <dlfcn.h>
#include <mutex>

#include "common.cuh"

namespace {
void *nccl_lib = nullptr;
char nccl_why[512] = "";
std::once_flag nccl_once;

void open_nccl() {
    if (!(nccl_lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL)))
        snprintf(nccl_why, sizeof nccl_why, "not found (%s); install it with "
                 "pip install 'infinitrain[cuda]' (the nvidia-nccl wheel)", dlerror());
}
}  // namespace

const char *it_cuda_nccl_status(void) {
    std::call_once(nccl_once, open_nccl);
    return nccl_lib ? "found" : nccl_why;
}
