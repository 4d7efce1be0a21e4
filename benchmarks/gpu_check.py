"""The GPU path of a run, on a model of real size: TRL GRPO steps with generation by
`model.generate` and, where vllm is installed, by vLLM colocated on the training GPU.

    .venv/bin/python benchmarks/gpu_check.py [--steps 5] [--batch-size 32] [--completion-length 256]

The model is Qwen3-0.6B's shape (28 layers, hidden 1024, 16 heads, 8 KV heads, MLP 3072, tied
embeddings) with random weights, built here: nothing is downloaded. Its tokenizer is the
project's word tokenizer (`engine.policy.words`) over made-up words, sized to Qwen3's vocabulary
(151,936 tokens), and the model's `vocab_size` is taken from the tokenizer: every id the model can
sample decodes, in both generators. Both modes load the same saved weights in bfloat16 through
the project's loader and take their machine arguments from `engine.runs.launch.generation_args`,
as a run does. Random weights rarely emit EOS: completions run to full length, steps are alike.

Prints a table: seconds per step (the median after the first, which loads vLLM's weights and
warms kernels up), the first step, torch's peak allocated memory in this process, and the memory
in use on the device after the last step (vLLM's preallocated share included). Without CUDA it
says so and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from engine.config import ComputeConfig
from engine.runs.launch import cuda_available, generation_args, vllm_available

#: Qwen3-0.6B's vocabulary: the word tokenizer is built to exactly this many tokens.
QWEN3_VOCAB = 151936
DTYPE = "bfloat16"
GIB = 2**30


def build_tokenizer() -> Any:
    """The word tokenizer over made-up words ("w0", "w1", ...), QWEN3_VOCAB tokens in all: each
    word adds itself and its leading-space form to the special tokens and character fallback."""
    from engine.policy.words import FALLBACK, build_word_tokenizer

    base = 4 + len(FALLBACK)  # the four special tokens, then the characters
    tokenizer = build_word_tokenizer([f"w{i}" for i in range((QWEN3_VOCAB - base) // 2)])
    assert len(tokenizer) == QWEN3_VOCAB, len(tokenizer)
    return tokenizer


def build_model(directory: Path) -> int:
    """A Qwen3-0.6B-shaped causal LM with random weights and its tokenizer, saved to `directory`
    (colocated vLLM loads the policy from the model's directory); returns its parameter count."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    tokenizer = build_tokenizer()
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=40960,
        max_window_layers=28,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model.num_parameters()


def prompts(n: int, words: int = 24) -> list[str]:
    """`n` prompts of `words` made-up words (one token each)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 70000, (n, words), generator=generator).tolist()
    return [" ".join(f"w{i}" for i in row) for row in ids]


def length_reward(completions: list[str], **kw: Any) -> list[float]:
    """A trivial reward with spread in every group: the completion's length in characters."""
    return [len(c) / 1000 for c in completions]


def time_grpo(model_dir: Path, out: Path, compute: ComputeConfig, args: argparse.Namespace, vllm: bool) -> list[Any]:
    """One table row: `args.steps` GRPO steps of the saved model, timed step by step."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from engine.policy.pretrained import load_model

    class StepTimer(TrainerCallback):
        """Seconds of each optimizer step, generation included (GRPO generates inside the step)."""

        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.start = 0.0

        def on_step_begin(self, *_: Any, **kw: Any) -> None:
            torch.cuda.synchronize()
            self.start = time.perf_counter()

        def on_step_end(self, *_: Any, **kw: Any) -> None:
            torch.cuda.synchronize()
            self.seconds.append(time.perf_counter() - self.start)

    machine = generation_args(compute, DTYPE, vllm=vllm)
    if machine["use_vllm"]:
        # vLLM sizes its KV cache for max_model_len; the prompts and completions here are far shorter.
        machine["vllm_max_model_length"] = 64 + args.completion_length
    model, tokenizer = load_model(model_dir, DTYPE)
    timer = StepTimer()
    torch.cuda.reset_peak_memory_stats()
    trainer = GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=[length_reward],
        args=GRPOConfig(
            output_dir=str(out),
            max_steps=args.steps,
            per_device_train_batch_size=args.batch_size,
            num_generations=args.num_generations,
            max_completion_length=args.completion_length,
            learning_rate=1e-6,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            gradient_checkpointing=False,
            dataloader_num_workers=0,
            seed=0,
            **machine,
        ),
        train_dataset=Dataset.from_dict({"prompt": prompts(4 * args.batch_size)}),
        callbacks=[timer],
    )
    trainer.train()
    free, total = torch.cuda.mem_get_info()
    steady = timer.seconds[1:] or timer.seconds
    row = [
        "vLLM colocate" if machine["use_vllm"] else "model.generate",
        f"{statistics.median(steady):.2f}",
        f"{timer.seconds[0]:.2f}",
        f"{torch.cuda.max_memory_allocated() / GIB:.1f}",
        f"{(total - free) / GIB:.1f}",
    ]
    del trainer, model
    gc.collect()
    torch.cuda.empty_cache()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="GRPO steps per mode (the first is reported apart)")
    parser.add_argument("--batch-size", type=int, default=32, help="completions per step")
    parser.add_argument("--num-generations", type=int, default=8, help="completions per prompt (a group)")
    parser.add_argument("--completion-length", type=int, default=256, help="max new tokens per completion")
    args = parser.parse_args()
    console = Console()
    vllm = vllm_available()
    if not cuda_available():
        console.print(
            f"no CUDA device: nothing measured (on a GPU this times {args.steps} TRL GRPO steps of a "
            "Qwen3-0.6B-shaped model with model.generate and, vllm installed, colocated vLLM: s/step, peak GiB)",
            soft_wrap=True,
        )
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    compute = ComputeConfig()  # the defaults: vllm = "auto", colocated, 0.3 of the GPU
    # vLLM last: what it sets up in this process (torch.distributed, its engine) is not torn down.
    modes = [False, True] if vllm else [False]
    with tempfile.TemporaryDirectory(prefix="evotui-gpu-check-") as tmp:
        root = Path(tmp)
        console.print(f"building the model in {root} ...")
        parameters = build_model(root / "model")
        rows = [time_grpo(root / "model", root / f"trainer-{mode}", compute, args, mode) for mode in modes]

    name = torch.cuda.get_device_name()
    table = Table(
        title=f"GRPO on {name}: Qwen3-0.6B shape ({parameters / 1e9:.2f}B parameters), {DTYPE}, "
        f"{args.batch_size} x {args.completion_length} tokens a step"
    )
    for column in ("mode", "s/step", "first step s", "peak GiB (torch)", "device used GiB"):
        table.add_column(column, justify="left" if column == "mode" else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if not vllm:
        console.print('vllm is not installed: no vLLM row (install the `gpu` extra: pip install "evotui[gpu]")')
    return 0


if __name__ == "__main__":
    sys.exit(main())
