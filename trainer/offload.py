"""The trainer's frozen base weights kept in CPU memory while a colocated vLLM serves rollouts
(`ModelConfig.offload_during_rollouts`, issue #12's weight arrangement).

On one GPU the trainer and vLLM each hold a copy of the base weights. vLLM's sleep mode frees vLLM's copy during
a training step; this frees the trainer's copy during rollouts, so vLLM's share (`gpu_memory_utilization`) can take
that memory for its KV cache: at the 32B shape the two copies are 2 x 61 GiB of the H200's 140 GiB.

    offload = WeightOffload(peft_model)      # the parameters that do not train (LoRA's stay where they are)
    offload.to_cpu()                         # before vLLM starts and after each step, before vLLM wakes
    offload.to_device()                      # after vLLM sleeps, before the step

The parameters keep their identity (`param.data` is swapped), so the optimizer, peft and tied weights are not
disturbed; LoRA parameters, their AdamW state and the buffers stay on the device. The CPU copy is allocated once,
pinned when CUDA is present (page-locked memory copies at the bus's speed), and kept: host memory holds the
model's size for the whole run, beside vLLM's own copy while it sleeps at level 1.

Cost per step: the base weights' bytes copied to the device and back (not measured yet; at PCIe 5 speeds,
tens of GB/s, a few seconds at 32B).
"""

from __future__ import annotations

import time


class WeightOffload:
    """Moves `model`'s parameters that do not require grad between their device and CPU memory."""

    def __init__(self, model) -> None:
        import torch

        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"WeightOffload takes a torch module, not {type(model).__name__}")
        self.params = [p for p in model.parameters() if not p.requires_grad]
        if not self.params:
            raise ValueError("the model has no frozen parameters to offload (a LoRA-wrapped model has its base)")
        devices = {p.device for p in self.params}
        if len(devices) != 1:
            raise ValueError(f"the frozen parameters lie on several devices ({sorted(map(str, devices))}): "
                             "offloading moves one model on one device")
        self.device = devices.pop()
        self._cpu: list | None = None
        self.on_device = True
        self.bytes = sum(p.numel() * p.element_size() for p in self.params)
        self.seconds: list[float] = []  # each move, in order

    def to_cpu(self) -> float:
        """Copy the frozen weights into the (reused) CPU buffers and free them on the device; seconds taken."""
        import torch

        if not self.on_device:
            return 0.0
        started = time.perf_counter()
        cuda = self.device.type == "cuda"
        if self._cpu is None:
            self._cpu = [torch.empty(p.shape, dtype=p.dtype, device="cpu", pin_memory=cuda) for p in self.params]
        for p, host in zip(self.params, self._cpu, strict=True):
            host.copy_(p.data, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize(self.device)
        for p, host in zip(self.params, self._cpu, strict=True):
            p.data = host
        if cuda:
            torch.cuda.empty_cache()  # the freed blocks go back to the driver, for vLLM
        self.on_device = False
        self.seconds.append(time.perf_counter() - started)
        return self.seconds[-1]

    def to_device(self) -> float:
        """Copy the frozen weights back to their device (the CPU buffers are kept for the next move)."""
        import torch

        if self.on_device:
            return 0.0
        started = time.perf_counter()
        cuda = self.device.type == "cuda"
        for p in self.params:
            p.data = p.data.to(self.device, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize(self.device)
        self.on_device = True
        self.seconds.append(time.perf_counter() - started)
        return self.seconds[-1]
