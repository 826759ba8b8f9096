"""Where a rank computes, in one place: device choice, the availability check, and host staging.

``workload.device: cpu | cuda``. With ``cuda`` every rank takes the GPU of its local rank
(``local_rank % torch.cuda.device_count()``), and the model, its optimizer state and the data
live there. The algorithms and the native layer always work on host memory: the native layer
reduces on the CPU (in its progress thread, also for wait-avoiding and push-sum), so a device
pointer would not help it even where the MPI library is CUDA-aware. The training loop
therefore stages the flat model and gradient through pinned host buffers at the points where
an algorithm may read or change them (:class:`Staging`). On the CPU the device buffers *are*
the host buffers and every copy is skipped.

``HARNESS_STAGE_ON_CPU=1`` stages through a second CPU buffer anyway, so the staging points are
tested without a GPU (a staged run must give bit-identical models).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.mpi_library import import_mpi

if TYPE_CHECKING:
    import torch

DEVICES = ("cpu", "cuda")
STAGE_ON_CPU_VAR = "HARNESS_STAGE_ON_CPU"


def unavailable_reason(device: str) -> str | None:
    """Why this machine cannot train on ``device`` (None: it can). Imports torch only for cuda."""
    if device == "cpu":
        return None
    import torch  # noqa: PLC0415  (lazy: only cuda needs torch; validate and run check without loading it)

    if not torch.cuda.is_available():
        build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
        return (
            f"no CUDA device is usable on this machine (torch {torch.__version__} is {build}, "
            f"torch.cuda.is_available() is False); use device: cpu"
        )
    return None


def scenario_device_problem(scenario) -> str | None:
    """``"workload.device: why"`` when this machine cannot run the scenario's device, else None
    (``validate`` and ``run`` refuse such a scenario before launching anything; ``sbatch`` does not
    check, since login nodes often have no GPU)."""
    reason = unavailable_reason(scenario.workload.device)
    return None if reason is None else f"workload.device: {scenario.workload.device}: {reason}"


def torch_device(device: str, local_rank: int):
    """The torch device of a rank: the CPU, or the GPU of its local rank."""
    import torch  # noqa: PLC0415  (lazy: this module is imported where torch is not loaded)

    if device == "cpu":
        return torch.device("cpu")
    reason = unavailable_reason(device)
    if reason is not None:
        raise RuntimeError(f"workload.device: {reason}")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def dataset_on(dataset, device):
    """``dataset`` with its tensors on ``device`` (the same object on the CPU)."""
    if device.type == "cpu":
        return dataset
    fields = ("train_x", "train_y", "test_x", "test_y")
    return dataclasses.replace(dataset, **{f: getattr(dataset, f).to(device) for f in fields})


def local_rank(world) -> int:
    """This rank's index among the ranks of its host (whatever launched them)."""
    MPI = import_mpi()  # lazy: importing mpi4py initializes MPI

    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_rank()
    finally:
        node.Free()


def mpi_cuda_aware() -> bool | None:
    """Whether the MPI library the native layer calls says it is CUDA-aware
    (``MPIX_Query_cuda_support``, which MPICH and Open MPI export; ``harness._core``); None when
    the layer is not loaded or its library cannot tell. Recorded in run.json: the harness stages
    through host memory either way (see the module docstring)."""
    core = sys.modules.get("harness._core")
    if core is None:
        return None
    answer = core.mpi_cuda_support()
    return None if answer < 0 else bool(answer)


@dataclass
class Staging:
    """The flat parameters and gradients on the host (what algorithms and the native layer
    use) and on the device (what the model computes with); copies between them.

    On the CPU both sides are the same tensors and every copy is a no-op.
    """

    host_params: torch.Tensor
    host_grads: torch.Tensor
    device_params: torch.Tensor
    device_grads: torch.Tensor

    @classmethod
    def of(cls, device_params, device_grads, stage_on_cpu: bool | None = None) -> Staging:
        """Host buffers for the model's flat device buffers: pinned on a GPU run, the same
        tensors on the CPU (unless ``stage_on_cpu``, default from ``HARNESS_STAGE_ON_CPU``)."""
        import torch  # noqa: PLC0415  (lazy: this module is imported where torch is not loaded)

        if stage_on_cpu is None:
            stage_on_cpu = os.environ.get(STAGE_ON_CPU_VAR, "") not in ("", "0")
        if device_params.device.type == "cpu" and not stage_on_cpu:
            return cls(device_params, device_grads, device_params, device_grads)
        pin = device_params.device.type == "cuda"
        host_params = torch.empty(device_params.shape, dtype=device_params.dtype, pin_memory=pin)
        host_grads = torch.empty(device_grads.shape, dtype=device_grads.dtype, pin_memory=pin)
        host_params.copy_(device_params)
        host_grads.copy_(device_grads)
        return cls(host_params, host_grads, device_params, device_grads)

    @property
    def staged(self) -> bool:
        return self.host_params is not self.device_params

    def params_to_device(self) -> None:
        """Before the model computes or steps: the algorithm may have changed the parameters."""
        if self.staged:
            self.device_params.copy_(self.host_params)

    def grads_to_host(self) -> None:
        """After backward: the algorithm reads (and may reduce) the gradients."""
        if self.staged:
            self.host_grads.copy_(self.device_grads)  # synchronous: the host sees the finished result

    def grads_to_device(self) -> None:
        if self.staged:
            self.device_grads.copy_(self.host_grads)

    def params_to_host(self) -> None:
        """After the optimizer step: the algorithm averages or sends the new parameters."""
        if self.staged:
            self.host_params.copy_(self.device_params)
