"""Triton kernels and their launchers, one file per kernel family.

Kernels (`_*_kernel`) own arithmetic; the launcher functions next to them own
grids, strides and dtype decisions. Nothing here imports `vase_triton.reference`.
"""
