"""Run by test_cuda.py in a process of its own: calls every kernel of the header on cuda:0
with valid sizes and device pointers that the host cannot read, printing each kernel's name
before its call and its status after. A kernel whose checks read device memory on the host
(indices, targets) kills this process at that name."""
import re
import sys

from infinitrain._native import HEADER_PATH, ffi, lib

ENUMS = {"it_unary_op": lib.IT_EXP, "it_binary_op": lib.IT_ADD, "it_scalar_op": lib.IT_SCALAR_ADD,
         "it_compare_op": lib.IT_EQ, "it_reduce_op": lib.IT_SUM}
INTS = {"diagonal": 0, "ignore_index": -100, "step": 1, "ndim": 1, "num_inputs": 1, "num_outputs": 1,
        "trans_a": 0, "trans_b": 0, "upper": 0, "largest": 1, "replacement": 1, "nesterov": 0,
        "first_step": 1, "row_offset": 0, "count_include_pad": 1, "training": 1, "stride_a": 4, "stride_b": 4,
        "stride_c": 4, "groups": 1}
FLOATS = {"low": 0.0, "eps": 1e-5, "beta1": 0.9, "beta2": 0.99}
HOST_ARRAYS = re.compile(r"(strides|shape|sizes)$")


def argument(decl: str, keep: list):
    ctype, name = decl.rsplit(" ", 1)
    while name.startswith("*"):
        ctype, name = ctype + " *", name[1:]
    if ctype in ("it_dtype",):
        return lib.IT_INT64 if name in ("index_dtype", "target_dtype") else lib.IT_FLOAT32
    if ctype in ENUMS:
        return ENUMS[ctype]
    if ctype.endswith("*const *"):  # a host array of device pointers (void *, float *, ...)
        element = ctype[:-len("const *")].strip()
        keep.append(ffi.new(f"{element}[1]", [ffi.cast(element, 64)]))
        return keep[-1]
    if ctype == "const it_attention_options *":  # host options: a device mask and dropout
        keep.append(ffi.new("it_attention_options *", {"bias": ffi.cast("float *", 4096),
                                                       "bias_stride_query": 2, "dropout_p": 0.1}))
        return keep[-1]
    if ctype == "const it_conv2d_params *":  # host geometry: a 3x3 convolution of a 2x2x4x4 input
        keep.append(ffi.new("it_conv2d_params *", dict(
            batch=2, in_channels=2, height=4, width=4, out_channels=2, kernel_h=3, kernel_w=3, stride_h=1,
            stride_w=1, pad_h=1, pad_w=1, dilation_h=1, dilation_w=1, groups=1)))
        return keep[-1]
    if ctype == "const it_pool2d_params *":  # host geometry: 2x2 windows over two 4x4 planes
        keep.append(ffi.new("it_pool2d_params *", dict(
            planes=2, height=4, width=4, kernel_h=2, kernel_w=2, stride_h=2, stride_w=2, pad_h=0, pad_w=0,
            dilation_h=1, dilation_w=1, ceil_mode=0)))
        return keep[-1]
    if "*" in ctype and HOST_ARRAYS.search(name):  # host metadata: one dimension of 2
        keep.append(ffi.new("int64_t[1]", [1 if "strides" in name else 2]))
        return keep[-1]
    if "*" in ctype:  # device memory: an address the host cannot read, one per buffer (no aliasing)
        keep.append(None)
        return ffi.cast(ctype, 64 * len(keep))
    if ctype in ("float", "double"):
        return FLOATS.get(name, 1.0)
    return INTS.get(name, 2)


def main() -> None:
    header = HEADER_PATH.read_text()
    cuda0 = ffi.new("it_device *", [lib.IT_CUDA, 0])[0]
    for name, rest in re.findall(r"it_status (it_\w+)\(it_device device,([^;]*?)\);", header, re.S):
        if name in ("it_storage_new", "it_storage_wrap") or "**" in rest or "it_stream" in rest \
                or "it_memory_stats" in rest or name.startswith("it_comm"):
            continue
        keep = []
        args = [argument(re.sub(r"\s+", " ", d.strip()), keep) for d in rest.split(",")]
        print(name, end=" ", flush=True)
        status = getattr(lib, name)(cuda0, *args)
        print(status, ffi.string(lib.it_last_error()).decode().split(":")[0], flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
