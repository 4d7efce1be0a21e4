"""The machine-dependent side of launching a run: the device, how GRPO generates, the command.

Pure functions of `[compute]` (`ComputeConfig`) and of what this machine has (a CUDA device,
vllm installed), so the GPU path is testable on a CPU: each takes `cuda` and `vllm` overrides
that stand in for the probes. torch is imported only to probe CUDA: the engine process builds
worker commands and otherwise never loads it.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from engine.config import ComputeConfig

WORKER_MODULE = "engine.runs.worker"
#: `accelerate launch`, run as a module of the worker's own interpreter (no `accelerate` script on PATH needed).
ACCELERATE_LAUNCH = "accelerate.commands.launch"
#: `[policy] dtype` values under which training uses bf16 mixed precision, where the GPU supports it.
#: Not "float16": fp16 mixed precision needs float32 master weights (torch's GradScaler refuses to
#: unscale float16 gradients), and a float16 policy's weights are loaded in float16: it trains as is.
BF16_DTYPES = ("bfloat16", "auto")


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (imports torch)."""
    import torch

    return torch.cuda.is_available()


def vllm_available() -> bool:
    """Whether vllm is installed (the `gpu` extra), without importing it."""
    return importlib.util.find_spec("vllm") is not None


def _bf16_supported() -> bool:
    import torch

    return torch.cuda.is_bf16_supported()


def generation_args(
    compute: ComputeConfig, dtype: str, cuda: bool | None = None, vllm: bool | None = None
) -> dict[str, Any]:
    """The keyword arguments of TRL's `GRPOConfig` that depend on the machine.

    Without CUDA: the CPU, float32, generation by `model.generate` (bf16 is set to False
    explicitly: TRL turns it on when left unset). With CUDA: bf16 mixed precision for a bfloat16
    or "auto" policy (`dtype`, `[policy] dtype`) where the GPU supports it, and generation by vLLM
    when `compute.vllm` is "on", or "auto" with vllm installed, colocated on the training GPUs or
    through a `trl vllm-serve` server (`compute.vllm_mode`).

    Raises ValueError for `compute.vllm = "on"` on a machine without CUDA or without vllm.
    """
    cuda = cuda_available() if cuda is None else cuda
    vllm = vllm_available() if vllm is None else vllm
    if compute.vllm == "on" and not (cuda and vllm):
        missing = " and ".join(
            lack for lack, ok in (("no CUDA device", cuda), ("vllm is not installed", vllm)) if not ok
        )
        raise ValueError(
            f'compute.vllm = "on" needs a CUDA device and vllm, but here {missing}: install the `gpu` extra '
            '(`pip install "evotui[gpu]"`) on a CUDA machine, or set compute.vllm = "auto" (vLLM where it can '
            'run) or "off"'
        )
    if not cuda:
        return {"use_cpu": True, "bf16": False, "use_vllm": False}
    args: dict[str, Any] = {"use_cpu": False, "bf16": dtype in BF16_DTYPES and _bf16_supported(), "use_vllm": False}
    if compute.vllm == "off" or not vllm:
        return args
    args.update(use_vllm=True, vllm_mode=compute.vllm_mode)
    if compute.vllm_mode == "colocate":
        args["vllm_gpu_memory_utilization"] = compute.vllm_gpu_memory_utilization
    else:  # the server's own memory share is set where it is started (`trl vllm-serve --gpu_memory_utilization`)
        args.update(vllm_server_host=compute.vllm_server_host, vllm_server_port=compute.vllm_server_port)
    return args


def device(cuda: bool | None = None) -> str:
    """Where warm-up and evaluation run: "cuda" or "cpu"."""
    return "cuda" if (cuda_available() if cuda is None else cuda) else "cpu"


def worker_command(python: str, run_dir: Path, compute: ComputeConfig, cuda: bool | None = None) -> list[str]:
    """The command line of a run's worker: `python -m engine.runs.worker RUN_DIR` on one GPU (or
    none), else the same module under `accelerate launch` with one process per GPU, through the
    same interpreter: DDP, or what `compute.accelerate_config` sets up (FSDP, DeepSpeed).

    `compute.accelerate_config` is used, and checked, only with `compute.gpus > 1`. Raises
    ValueError for several GPUs without CUDA, or for an accelerate config file that does not exist.
    """
    worker = ["-m", WORKER_MODULE, str(run_dir)]
    if compute.gpus <= 1:
        return [python, *worker]
    if not (cuda_available() if cuda is None else cuda):
        raise ValueError(
            f"compute.gpus = {compute.gpus} launches {compute.gpus} worker processes on CUDA devices, but this "
            "machine has no CUDA device: set compute.gpus = 1"
        )
    if compute.accelerate_config is None:
        topology = ["--multi_gpu"]
    else:
        config = Path(compute.accelerate_config)
        if not config.is_file():
            raise ValueError(
                f"compute.accelerate_config: no file at {config}; write one with "
                f"`accelerate config --config_file {config}`, or remove the setting for plain DDP"
            )
        topology = ["--config_file", str(config)]
    return [python, "-m", ACCELERATE_LAUNCH, "--num_processes", str(compute.gpus), *topology, *worker]


def is_main_process() -> bool:
    """Whether this is rank 0 of a multi-process run (torchrun and accelerate set RANK), or the one
    process of a single-process run. Only rank 0 writes rollouts and events."""
    return os.environ.get("RANK", "0") == "0"
