"""Sampling speed of the embedded policies: HF `generate` against `engine.policy.sampler`.

    .venv/bin/python benchmarks/sampler.py [--quick] [--threads N] [--no-eval]

For the math (sample) and code templates' embedded sizes, random weights (seed 0), and batches
of 1, 64 and 256 val prompts: milliseconds per token step of HF `generate`, of the sampler, and
what bounds a step from below. A token step is the marginal cost of one more new token, (time
for 8 + S new tokens - time for 8) / S, sampling at temperature 1 with a stop token that never
comes, so every row runs the whole budget (best of a few repetitions). The floors: "matmuls" times the step's linear
layers alone at that batch (q/k/v, o, gate/up, down of every layer, and the LM head, as bare
`F.linear` calls on the sampler's stacked weights: no attention, no norms, no sampling); "FLOPs"
is the same arithmetic divided by this CPU's throughput on one large matmul; "attention" times
the step's attention alone over a cache of the timed steps' mean length (bare
`scaled_dot_product_attention` calls, one per layer): it reads the whole KV cache every step,
so from a few dozen rows on it is bound by memory bandwidth, and HF pays it too. A step cannot
cost less than matmuls + attention.

Then the seconds of one version's evaluation (`evaluate`: greedy plus the template's sampled
passes over val, at its evaluation budget; the SWE template's episodes too), before (every caller
falling back to HF `generate`, as before the sampler) and after. Random weights stop nowhere, so
every completion and action runs its whole budget: an upper bound of a trained policy's time.
Prints the load average before and after: a figure taken beside other work is not a figure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from engine.config import WorkspaceConfig, parse_config
from engine.domains import make_domain
from engine.policy import sampler
from engine.policy.pretrained import PromptFormat
from engine.policy.tiny import build_tiny_policy
from engine.runs.evaluate import evaluate
from engine.workspace import template_dir

TEMPLATES = {"math": "sample", "code": "code", "swe": "swe"}
#: New tokens before the timed ones: the prompt's encoding and the first steps cancel out.
BASE_TOKENS = 8


def template_config(name: str) -> WorkspaceConfig:
    path = template_dir("sample") / ("workspace.toml" if name == "sample" else f"variants/{name}.toml")
    return parse_config(path.read_text(), path)


def policy(domain_name: str, val_size: int | None = None) -> tuple[Any, Any, Any, WorkspaceConfig]:
    config = template_config(TEMPLATES[domain_name])
    if val_size is not None:
        config = config.model_copy(update={"domain": config.domain.model_copy(update={"val_size": val_size})})
    domain = make_domain(config.domain)
    model, tokenizer = build_tiny_policy(config.policy.embedded, domain, seed=0)
    model.eval()
    return model, tokenizer, domain, config


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def step_ms(
    generate: Callable[..., list[list[int]]], model: Any, prompts: list[list[int]], never: int, steps: int, repeats: int
) -> float:
    """Marginal milliseconds of one token step of `generate` (see the module docstring)."""

    def run(new: int) -> Callable[[], object]:
        return lambda: generate(model, prompts, new, [never], model.config.pad_token_id, True, 1.0)

    run(2)()  # first-call costs (allocations, kernels' plans)
    short = best_seconds(run(BASE_TOKENS), repeats)
    long = best_seconds(run(BASE_TOKENS + steps), repeats)
    return (long - short) / steps * 1000


def matmul_floor_ms(model: Any, rows: int, repeats: int) -> float:
    """Milliseconds of one step's linear layers alone at `rows` rows (the sampler's weights)."""
    with torch.inference_mode():
        net = sampler._Network(model)
        x = torch.randn(rows, net.hidden)
        ffn = net.layers[0].down.shape[1]
        act = torch.randn(rows, ffn)

        def step() -> None:
            for _ in range(20):
                for layer in net.layers:
                    F.linear(x, layer.qkv)
                    F.linear(x, layer.out)
                    F.linear(x, layer.gate_up)
                    F.linear(act, layer.down)
                F.linear(x, net.lm_head)

        step()
        return best_seconds(step, repeats) / 20 * 1000


def attention_ms(model: Any, rows: int, columns: int, repeats: int) -> float:
    """Milliseconds of one step's attention alone: one query per row and head over a cache of
    `columns` keys in every layer (`scaled_dot_product_attention`, as the sampler calls it). It
    reads the whole cache, so beyond a few rows it is bound by memory, not arithmetic."""
    net_heads, dim = model.config.num_attention_heads, model.config.hidden_size // model.config.num_attention_heads
    layers = model.config.num_hidden_layers
    cache = torch.randn(layers, 2, rows, net_heads, columns, dim)
    query, mask = torch.randn(rows, net_heads, 1, dim), torch.zeros(rows, 1, 1, columns)

    def step() -> None:
        for _ in range(5):
            for keys, values in cache:
                F.scaled_dot_product_attention(query, keys, values, attn_mask=mask)

    step()
    return best_seconds(step, repeats) / 5 * 1000


def step_flops(model: Any, rows: int) -> float:
    """Multiply-adds x 2 of one step's linear layers (attention's are ~1% at these lengths)."""
    config = model.config
    hidden, ffn, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    per_row = layers * (4 * hidden * hidden + 3 * hidden * ffn) + hidden * config.vocab_size
    return 2.0 * rows * per_row


def matmul_gflops() -> float:
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    return 2 * 1024**3 / best_seconds(lambda: a @ b, 10) / 1e9


@contextmanager
def hf_generate_everywhere() -> Iterator[None]:
    """The code paths as they were before the sampler: `supports` says no, so `generate_ids` and
    `open_session` fall back to HF `generate` (re-encoding an episode's context every turn)."""
    supports = sampler.supports
    sampler.supports = lambda model: False  # type: ignore[assignment]
    try:
        yield
    finally:
        sampler.supports = supports


def evaluation_seconds(domain_name: str, val_size: int | None, budget: int | None) -> tuple[float, float, int]:
    """Seconds of one version's evaluation, before and after, and the number of val tasks."""
    model, tokenizer, domain, config = policy(domain_name, val_size)

    def run() -> object:
        torch.manual_seed(0)
        return evaluate(
            model,
            tokenizer,
            domain,
            config.recipe.rewards,
            budget if budget is not None else config.eval.max_completion_length,
            config.eval.sampled_seeds,
            config.eval.temperature,
            "bench",
            0,
            fmt=PromptFormat.of(config.policy, domain),
        )

    with hf_generate_everywhere():
        before = best_seconds(run, 1)
    after = best_seconds(run, 1)
    return before, after, len(domain.tasks("val"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke mode: batches 1 and 64, few steps, small val")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--no-eval", action="store_true", help="skip the evaluation timings")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(width=132)
    load_before = os.getloadavg()
    batches = (1, 64) if args.quick else (1, 64, 256)
    steps, repeats = (16, 3) if args.quick else (32, 5)
    gflops = matmul_gflops()
    table = Table(
        title=f"ms per token step, torch threads {torch.get_num_threads()}, one large matmul {gflops:.0f} GFLOP/s"
    )
    columns = ("policy", "params", "batch", "HF generate", "sampler", "speed-up", "matmuls", "FLOPs", "attention")
    for column in columns:
        table.add_column(column, justify="right")
    for name in ("math", "code"):
        model, tokenizer, domain, _ = policy(name, max(batches))
        prompts = PromptFormat().encode(tokenizer, [t.prompt for t in domain.tasks("val")])
        never = len(tokenizer)  # no logit can pick it: every row runs the whole budget
        for rows in batches:
            batch = prompts[:rows]
            hf = step_ms(sampler.hf_generate_ids, model, batch, never, steps, repeats)
            fast = step_ms(sampler.generate_ids, model, batch, never, steps, repeats)
            floor = matmul_floor_ms(model, rows, repeats)
            # the cache's mean length over the timed steps
            attention = attention_ms(model, rows, max(map(len, batch)) + BASE_TOKENS + steps // 2, repeats)
            flops = step_flops(model, rows) / (gflops * 1e9) * 1000
            table.add_row(
                name,
                f"{model.num_parameters() / 1e6:.2f}M",
                str(rows),
                f"{hf:.2f}",
                f"{fast:.2f}",
                f"{hf / fast:.1f}x",
                f"{floor:.2f}",
                f"{flops:.2f}",
                f"{attention:.2f}",
            )
    console.print(table)
    if not args.no_eval:
        evals = Table(title="one version's evaluation (greedy + sampled passes over val), seconds")
        for column in ("domain", "val tasks", "before (HF generate)", "after (sampler)", "speed-up"):
            evals.add_column(column, justify="right")
        for name in ("math", "code", "swe"):
            before, after, tasks = evaluation_seconds(name, 32 if args.quick else None, 16 if args.quick else None)
            evals.add_row(name, str(tasks), f"{before:.1f}", f"{after:.1f}", f"{before / after:.1f}x")
        console.print(evals)
    load_after = os.getloadavg()
    console.print(f"load average (1, 5, 15 min): before {load_before}, after {load_after}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
