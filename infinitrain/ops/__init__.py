"""Differentiable operations: autograd Functions over the native kernels."""
