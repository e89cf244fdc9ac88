"""Per-GPU autotuning of the kernels' launch parameters, persisted and validated.

- `shapes`: launch shapes and their coarse keys (bucketed sizes, head layout, dtype, flags).
- `spaces`: each kernel's search space, pruned by shape and by what the device can hold.
- `store`: one JSON file per (device, Triton version); locked, atomic writes.
- `lookup`: what a launcher asks on every launch (memoised; `VASE_AUTOTUNE`).
- `problems`, `tuner`, `timing`: checking each candidate against the reference, timing it,
  choosing and storing the winner.
- `model_shapes`, `command`: the launches of a model and `vase-triton autotune`.

Importing this package loads nothing else and queries no GPU.
"""
