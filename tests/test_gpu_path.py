"""The GPU side of launching a run, checked on a CPU: TRL's GRPOConfig and accelerate's own launch
parser take what `engine.runs.launch` builds for a CUDA machine."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers.training_args
from accelerate.commands.launch import launch_command_parser
from trl import GRPOConfig

from engine.config import ComputeConfig
from engine.runs.launch import (
    ACCELERATE_LAUNCH,
    WORKER_MODULE,
    device,
    generation_args,
    is_main_process,
    worker_command,
)

PYTHON = "/opt/venv/bin/python"


@pytest.fixture
def bf16_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU that supports bf16, to the two checks that ask: `generation_args` asks torch, and
    TrainingArguments' validation refuses bf16 without use_cpu unless transformers'
    `is_torch_bf16_gpu_available` (the name training_args imported) says yes. No device is faked:
    `torch.cuda.is_available()` stays False, so the config still sets itself up on the CPU."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kw: True)
    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)


def grpo_config(output_dir: Path, **machine: object) -> GRPOConfig:
    return GRPOConfig(output_dir=str(output_dir), report_to="none", **machine)  # type: ignore[arg-type]


def test_a_cuda_machine_with_vllm_generates_with_colocated_vllm(tmp_path: Path, bf16_gpu: None) -> None:
    compute = ComputeConfig(vllm_gpu_memory_utilization=0.55)  # not TRL's default (0.3): it must pass through
    config = grpo_config(tmp_path, **generation_args(compute, "bfloat16", cuda=True, vllm=True))
    assert config.use_vllm and config.vllm_mode == "colocate"
    assert config.vllm_gpu_memory_utilization == 0.55
    assert config.bf16 and not config.use_cpu


def test_server_mode_passes_the_server_address(tmp_path: Path, bf16_gpu: None) -> None:
    compute = ComputeConfig(vllm="on", vllm_mode="server", vllm_server_host="10.0.0.7", vllm_server_port=8123)
    args = generation_args(compute, "bfloat16", cuda=True, vllm=True)
    assert "vllm_gpu_memory_utilization" not in args  # set where the server is started, not here
    config = grpo_config(tmp_path, **args)
    assert config.use_vllm and config.vllm_mode == "server"
    assert (config.vllm_server_host, config.vllm_server_port) == ("10.0.0.7", 8123)


@pytest.mark.parametrize(
    ("dtype", "supported", "bf16"),
    [
        ("bfloat16", True, True),
        ("auto", True, True),
        ("bfloat16", False, False),  # a GPU without bf16: TrainingArguments would refuse bf16 = True
        ("float32", True, False),
        ("float16", True, False),
    ],
)
def test_bf16_only_for_a_bf16_policy_on_a_gpu_that_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dtype: str, supported: bool, bf16: bool
) -> None:
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kw: supported)
    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: supported)
    config = grpo_config(tmp_path, **generation_args(ComputeConfig(vllm="off"), dtype, cuda=True))
    assert config.bf16 is bf16  # an explicit False: TRL turns bf16 on when it is left unset
    assert not config.fp16 and not config.use_cpu and not config.use_vllm


@pytest.mark.parametrize(("vllm_setting", "installed"), [("auto", False), ("off", True)])
def test_no_vllm_on_a_cuda_machine_unless_installed_and_wanted(vllm_setting: str, installed: bool) -> None:
    compute = ComputeConfig(vllm=vllm_setting)  # type: ignore[arg-type]
    args = generation_args(compute, "float32", cuda=True, vllm=installed)
    assert args == {"use_cpu": False, "bf16": False, "use_vllm": False}


def test_without_cuda_the_cpu_in_float32_and_no_vllm(tmp_path: Path) -> None:
    args = generation_args(ComputeConfig(), "bfloat16", cuda=False, vllm=True)
    assert args == {"use_cpu": True, "bf16": False, "use_vllm": False}
    config = grpo_config(tmp_path, **args)
    assert config.use_cpu and not config.bf16 and not config.use_vllm
    assert config.device.type == "cpu"


@pytest.mark.parametrize(("cuda", "installed"), [(False, True), (True, False), (False, False)])
def test_vllm_on_without_cuda_or_vllm_says_what_to_do(cuda: bool, installed: bool) -> None:
    with pytest.raises(ValueError, match="compute.vllm") as info:
        generation_args(ComputeConfig(vllm="on"), "bfloat16", cuda=cuda, vllm=installed)
    message = str(info.value)
    assert "`gpu` extra" in message and '"off"' in message
    assert ("no CUDA device" in message) is not cuda and ("vllm is not installed" in message) is not installed


def test_device() -> None:
    assert device(cuda=True) == "cuda" and device(cuda=False) == "cpu"
    assert device() == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("gpus", [0, 1])
def test_one_gpu_or_none_runs_the_worker_module_directly(tmp_path: Path, gpus: int) -> None:
    for cuda in (True, False):
        command = worker_command(PYTHON, tmp_path, ComputeConfig(gpus=gpus), cuda=cuda)
        assert command == [PYTHON, "-m", WORKER_MODULE, str(tmp_path)]


def test_several_gpus_launch_the_worker_module_through_accelerate(tmp_path: Path) -> None:
    command = worker_command(PYTHON, tmp_path, ComputeConfig(gpus=4), cuda=True)
    assert command == [
        *(PYTHON, "-m", ACCELERATE_LAUNCH, "--num_processes", "4", "--multi_gpu"),
        *("-m", WORKER_MODULE, str(tmp_path)),
    ]
    # What `accelerate launch` itself makes of it (its own parser, after `python -m accelerate.commands.launch`).
    parsed = launch_command_parser().parse_args(command[3:])
    assert parsed.num_processes == 4 and parsed.multi_gpu and parsed.config_file is None
    assert parsed.module and not parsed.no_python
    assert parsed.training_script == WORKER_MODULE and parsed.training_script_args == [str(tmp_path)]


def test_an_accelerate_config_file_replaces_plain_ddp(tmp_path: Path) -> None:
    config = tmp_path / "fsdp.yaml"
    config.write_text("distributed_type: FSDP\n", encoding="utf-8")
    run_dir = tmp_path / "run"
    command = worker_command(PYTHON, run_dir, ComputeConfig(gpus=4, accelerate_config=config), cuda=True)
    assert command[3:7] == ["--num_processes", "4", "--config_file", str(config)]
    assert "--multi_gpu" not in command
    parsed = launch_command_parser().parse_args(command[3:])
    assert parsed.config_file == str(config) and parsed.num_processes == 4 and not parsed.multi_gpu
    assert parsed.module and parsed.training_script == WORKER_MODULE and parsed.training_script_args == [str(run_dir)]


def test_a_missing_accelerate_config_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"
    with pytest.raises(ValueError, match="compute.accelerate_config") as info:
        worker_command(PYTHON, tmp_path, ComputeConfig(gpus=2, accelerate_config=missing), cuda=True)
    assert str(missing) in str(info.value)


def test_several_gpus_without_cuda_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="compute.gpus = 4"):
        worker_command(PYTHON, tmp_path, ComputeConfig(gpus=4), cuda=False)


def test_the_accelerate_launch_module_exists() -> None:
    assert importlib.util.find_spec(ACCELERATE_LAUNCH) is not None


@pytest.mark.parametrize(("rank", "main"), [(None, True), ("0", True), ("1", False), ("3", False)])
def test_only_rank_0_is_the_main_process(monkeypatch: pytest.MonkeyPatch, rank: str | None, main: bool) -> None:
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    assert is_main_process() is main


def test_the_engine_builds_a_worker_command_without_loading_torch() -> None:
    script = (
        "import sys; from pathlib import Path; from engine.config import ComputeConfig; "
        "from engine.runs.launch import worker_command; "
        "worker_command(sys.executable, Path('run'), ComputeConfig()); "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=Path(__file__).parents[1])
