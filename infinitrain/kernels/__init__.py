"""Thin Python bindings of the native kernels: they take and return Tensors, check shapes,
dtypes and devices (naming both sides when they disagree), allocate outputs and call the
library. Autograd (infinitrain.ops) builds differentiable functions on top of them."""
