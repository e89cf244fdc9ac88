"""The device a configuration is tuned for: its identity (store file name) and its limits (pruning).

Two GPUs of one architecture can differ in SM count and bandwidth (H100 PCIe vs SXM), so
a device is identified by its name *and* its SM count. Limits come from the CUDA device
properties; where this torch build does not expose them, from the architecture's known
values. Nothing here queries a GPU at import time.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Optional

import torch

# Opt-in shared memory per block by compute capability (bytes), for torch builds whose
# device properties lack `shared_memory_per_block_optin`.
SHARED_MEMORY_BY_CAPABILITY = {
    (7, 0): 96 * 1024,
    (7, 5): 64 * 1024,
    (8, 0): 163 * 1024,
    (8, 6): 99 * 1024,
    (8, 7): 163 * 1024,
    (8, 9): 99 * 1024,
    (9, 0): 227 * 1024,
    (10, 0): 227 * 1024,
    (12, 0): 99 * 1024,
}
_REGISTERS_PER_BLOCK = 65536


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """Identity and limits of one device.

    name: the device name (`NVIDIA H200`); multiprocessors: SM count; capability:
    `(major, minor)` or None off CUDA; shared_memory: opt-in shared memory per block in
    bytes; registers: 32-bit registers per block.
    """

    name: str
    multiprocessors: int
    capability: Optional[tuple[int, int]]
    shared_memory: int
    registers: int = _REGISTERS_PER_BLOCK

    @property
    def label(self) -> str:
        """File-name-safe identity: `NVIDIA_H200-132sm`."""
        safe = re.sub(r"[^A-Za-z0-9.]+", "_", self.name).strip("_") or "device"
        return f"{safe}-{self.multiprocessors}sm"

    def describe(self) -> str:
        capability = f", sm_{self.capability[0]}{self.capability[1]}" if self.capability else ""
        return (
            f"{self.name} ({self.multiprocessors} SMs{capability}, {self.shared_memory // 1024} KiB shared memory "
            f"per block, {self.registers} registers per block)"
        )


# The limits the kernels are designed for (H100 SXM / H200, sm_90), used to list search
# spaces without a GPU and for the Triton interpreter.
SM90_PROFILE = DeviceProfile("NVIDIA H100/H200 (sm_90 limits)", 132, (9, 0), 227 * 1024)
INTERPRETER_PROFILE = DeviceProfile("Triton interpreter", 1, None, 227 * 1024)


@functools.lru_cache(maxsize=None)
def cuda_profile(index: int) -> DeviceProfile:
    """Profile of CUDA device `index` (memoised: device properties are read once)."""
    props = torch.cuda.get_device_properties(index)
    capability = (props.major, props.minor)
    shared = getattr(props, "shared_memory_per_block_optin", None) or SHARED_MEMORY_BY_CAPABILITY.get(
        capability, 48 * 1024
    )
    registers = getattr(props, "regs_per_multiprocessor", None) or _REGISTERS_PER_BLOCK
    return DeviceProfile(props.name, props.multi_processor_count, capability, int(shared), min(int(registers), _REGISTERS_PER_BLOCK))


def profile_for(device: torch.device) -> DeviceProfile:
    """Profile of the device a launch runs on: a CUDA GPU, or the interpreter for CPU tensors."""
    if device.type == "cuda":
        return cuda_profile(device.index if device.index is not None else torch.cuda.current_device())
    return INTERPRETER_PROFILE


def current_cuda_profile() -> Optional[DeviceProfile]:
    """Profile of the current CUDA device, or None without one."""
    if not torch.cuda.is_available():
        return None
    return cuda_profile(torch.cuda.current_device())
