"""The static-cache sampler (`engine.policy.sampler`) against HF `generate`, its oracle.

Policies are the sample templates' embedded sizes with a fixed seed. Single-turn ones stay random,
drawn wider than transformers' default so that their outputs depend on the prompt and stop at
different steps (see INIT_STD); the SWE one gets a short warm-up so
that its episodes follow the protocol (actions, submits, EOS, budgets). Greedy outputs must match
HF token for token except at a tie: where the two top logits are closer than float rounding can
separate, two implementations may pick differently, so each mismatch is checked to start at such
a tie (HF's own logits, recomputed without a cache) and counted."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import cache
from typing import Any

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from scipy.stats import chi2_contingency
from trl import GRPOTrainer

import engine.runs.worker as worker
from engine.config import WarmupConfig, WorkspaceConfig, parse_config
from engine.domains import make_domain
from engine.domains.base import Episode, Task
from engine.policy.pretrained import PromptFormat
from engine.policy.sampler import Session, generate_ids, hf_generate_ids, supports
from engine.policy.tiny import build_tiny_policy, warmup_policy
from engine.runs.episodes import MAX_ACTION_TOKENS, EpisodeRollout, play
from engine.workspace import template_dir

#: Two top logits closer than this (relative to the top one, at least 1) are a tie: float32
#: rounding of a 4-layer forward moves logits by ~1e-6; real disagreements are far larger.
TIE = 1e-4
#: The standard deviation of a random single-turn policy's weight matrices: at transformers'
#: default (0.02) a random policy repeats one token whatever its prompt, which tests nothing;
#: at 0.15 its greedy outputs differ from prompt to prompt and about half end with EOS.
INIT_STD = 0.15


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread: results do not depend on it, and OpenMP's spinning workers run ~10x
    slower when other processes share this machine's two cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def template_config(name: str) -> WorkspaceConfig:
    path = template_dir("sample") / ("workspace.toml" if name == "sample" else f"variants/{name}.toml")
    return parse_config(path.read_text(), path)


@cache
def policy(name: str, warmup_steps: int = 0) -> tuple[Any, Any, Any]:
    """(model, tokenizer, domain) of a sample template at its embedded size, seed 0: warmed up
    for `warmup_steps` batches of 8 demonstrations, or random with INIT_STD."""
    config = template_config(name)
    domain = make_domain(config.domain.model_copy(update={"train_size": 50, "val_size": 96}))
    model, tokenizer = build_tiny_policy(config.policy.embedded, domain, seed=0)
    if warmup_steps:
        warmup_policy(model, tokenizer, domain, WarmupConfig(steps=warmup_steps, batch_size=8, seed=0))
    else:
        torch.manual_seed(0)
        with torch.no_grad():
            for weight in model.parameters():
                if weight.dim() == 2:
                    weight.normal_(0.0, INIT_STD)
    model.eval()
    return model, tokenizer, domain


def tie_at(model: Any, context: Sequence[int], picks: set[int]) -> bool:
    """Whether HF's logits after `context` (a plain forward, no cache) have their two top tokens
    within TIE, and those two are the tokens the implementations picked."""
    with torch.no_grad():
        logits = model(torch.tensor([list(context)])).logits[0, -1]
    top = torch.topk(logits, 2)
    gap = float(top.values[0] - top.values[1])
    return gap <= TIE * max(1.0, abs(float(top.values[0]))) and picks <= set(top.indices.tolist())


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def count_ties(
    model: Any, contexts: Sequence[Sequence[int]], ours: Sequence[list[int]], theirs: Sequence[list[int]]
) -> int:
    """The rows where two greedy decodings of the same contexts differ, each checked to first
    differ at a tie (else the test fails there)."""
    ties = 0
    for context, a, b in zip(contexts, ours, theirs, strict=True):
        if a == b:
            continue
        k = first_difference(a, b)
        assert k < min(len(a), len(b)), f"one output is a prefix of the other: stopping differs ({a} vs {b})"
        assert tie_at(model, list(context) + b[:k], {a[k], b[k]}), f"greedy differs at step {k} without a tie"
        ties += 1
    return ties


@pytest.mark.parametrize(("template", "budget"), [("sample", 64), ("code", 40)])
def test_greedy_matches_hf_generate_token_for_token_except_at_ties(template: str, budget: int) -> None:
    """Every val prompt (96) of the template's domain, greedy, the sampler in one batch against HF
    in two: the same tokens and the same stops, except after a tie (counted)."""
    model, tokenizer, domain = policy(template)
    assert supports(model)
    prompts = PromptFormat().encode(tokenizer, [t.prompt for t in domain.tasks("val")])
    eos, pad = [tokenizer.eos_token_id], tokenizer.pad_token_id
    fast = generate_ids(model, prompts, budget, eos, pad, do_sample=False)
    # Two HF batches of different widths: padding must not change an answer either.
    half = len(prompts) // 2
    reference = [
        row
        for part in (prompts[:half], prompts[half:])
        for row in hf_generate_ids(model, part, budget, eos, pad, False)
    ]
    ended = sum(bool(row) and row[-1] == eos[0] for row in reference)
    assert 0 < ended < len(prompts), "some rows stop early and some run out of budget"
    ties = count_ties(model, prompts, fast, reference)
    print(f"{template}: {len(prompts)} prompts, {ended} ended by EOS, greedy mismatches at ties {ties}")


def chi_square_p(a: Counter[Any], b: Counter[Any]) -> float:
    """p-value of a two-sample chi-square test that `a` and `b` count draws of one distribution
    (categories with fewer than 10 draws in both samples together are merged into one, so that
    expected counts stay near 5 or more, as the test needs)."""
    keys = sorted(set(a) | set(b), key=lambda k: a[k] + b[k], reverse=True)
    big = [k for k in keys if a[k] + b[k] >= 10]
    rest = [k for k in keys if k not in big]
    table = [[a[k] for k in big], [b[k] for k in big]]
    if rest:
        table[0].append(sum(a[k] for k in rest))
        table[1].append(sum(b[k] for k in rest))
    if len(table[0]) < 2:
        return 1.0
    return float(chi2_contingency(table)[1])


def draws(rows: list[list[int]], positions: int) -> list[Counter[int]]:
    """Per position, the counts of the token drawn there (-1: the row had stopped)."""
    return [Counter(row[k] if k < len(row) else -1 for row in rows) for k in range(positions)]


def p_values(a: list[list[int]], b: list[list[int]], positions: int) -> list[float]:
    return [chi_square_p(x, y) for x, y in zip(draws(a, positions), draws(b, positions), strict=True)]


def test_sampling_draws_from_hf_generates_distribution() -> None:
    """Per prompt and position, the two samplers' token counts over 1,200 draws each pass a
    chi-square test at a Bonferroni-corrected 1e-3 level; the same test, on the same sample
    sizes, rejects a sampler at temperature 0.8 instead of 1 (it has the power to fail)."""
    model, tokenizer, domain = policy("sample")
    prompts = PromptFormat().encode(tokenizer, [t.prompt for t in domain.tasks("val")[:3]])
    n, positions, eos, pad = 1200, 3, [tokenizer.eos_token_id], tokenizer.pad_token_id
    tests = len(prompts) * positions
    alpha = 1e-3 / tests
    torch.manual_seed(0)
    ours = [generate_ids(model, [p] * n, positions, eos, pad, True, 1.0) for p in prompts]
    theirs = [hf_generate_ids(model, [p] * n, positions, eos, pad, True, 1.0) for p in prompts]
    colder = [generate_ids(model, [p] * n, positions, eos, pad, True, 0.8) for p in prompts]
    same = [p for o, t in zip(ours, theirs, strict=True) for p in p_values(o, t, positions)]
    apart = [p for c, t in zip(colder, theirs, strict=True) for p in p_values(c, t, positions)]
    print(f"min p same temperature {min(same):.3g}, min p 0.8 vs 1.0 {min(apart):.3g}, alpha {alpha:.3g}")
    assert min(same) > alpha
    assert min(apart) < alpha


# --- multi-turn -------------------------------------------------------------------------------


@torch.no_grad()
def reference_play(
    model: Any, tokenizer: Any, domain: Any, tasks: Sequence[Task], *, max_tokens: int
) -> list[EpisodeRollout]:
    """`play` as it was before the sampler, greedy: one HF `generate` a turn over every running
    episode's whole context (the oracle of the multi-turn test)."""
    newline = tokenizer.convert_tokens_to_ids("\n")
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    stops = [t for t in (newline, eos) if isinstance(t, int) and t != tokenizer.unk_token_id]
    envs = [domain.environment(task) for task in tasks]
    rollouts = [EpisodeRollout(Episode(task=task), list(tokenizer(task.prompt)["input_ids"]), [], []) for task in tasks]
    running = list(range(len(tasks)))
    for turn in range(domain.max_turns):
        running = [i for i in running if len(rollouts[i].completion_ids) < max_tokens]
        if not running:
            break
        contexts = [rollouts[i].prompt_ids + rollouts[i].completion_ids for i in running]
        width = max(map(len, contexts))
        input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
        attention = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
        budget = min(MAX_ACTION_TOKENS, max_tokens - min(len(rollouts[i].completion_ids) for i in running))
        generated = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            max_new_tokens=max(1, budget),
            eos_token_id=stops,
            pad_token_id=pad,
            do_sample=False,
        )[:, width:].tolist()
        still: list[int] = []
        for i, row in zip(running, generated, strict=True):
            r = rollouts[i]
            room = max_tokens - len(r.completion_ids)
            cut = next((k + 1 for k, t in enumerate(row) if t in stops), len(row))
            action_ids = row[: min(cut, room)]
            r.completion_ids += action_ids
            r.env_mask += [1] * len(action_ids)
            if action_ids and action_ids[-1] == eos:
                r.episode.actions.append(tokenizer.decode(action_ids, skip_special_tokens=True))
                continue
            action = tokenizer.decode(action_ids, skip_special_tokens=True)
            result = envs[i].step(action.strip())
            r.episode.actions.append(action)
            r.episode.calls.append(replace(result.call, turn=turn))
            observation_ids = list(tokenizer(result.observation, add_special_tokens=False)["input_ids"])
            room = max_tokens - len(r.completion_ids)
            r.episode.observations.append(result.observation)
            r.completion_ids += observation_ids[:room]
            r.env_mask += [0] * len(observation_ids[:room])
            if result.done:
                r.episode.submitted = True
                r.completion_ids.append(eos)
                r.env_mask.append(0)
            elif len(observation_ids) <= room:
                still.append(i)
        running = still
    for r, env in zip(rollouts, envs, strict=True):
        r.episode.truncated = not (r.completion_ids and r.completion_ids[-1] == eos)
        env.finish(r.episode)
    return rollouts


@pytest.mark.parametrize("max_tokens", [40, 200])
def test_play_keeps_the_per_turn_generate_episodes_with_one_cache(max_tokens: int) -> None:
    """Greedy SWE episodes with the cache kept across turns equal the old per-turn `generate`
    episodes (tokens, env_mask, actions, observations, truncation), except after a tie."""
    model, tokenizer, domain = policy("swe", warmup_steps=40)
    tasks = list(domain.tasks("val")[:32])
    ours = play(model, tokenizer, domain, tasks, max_tokens=max_tokens, do_sample=False)
    theirs = reference_play(model, tokenizer, domain, tasks, max_tokens=max_tokens)
    ties = 0
    for a, b in zip(ours, theirs, strict=True):
        if a.completion_ids == b.completion_ids:
            assert a.env_mask == b.env_mask and a.prompt_ids == b.prompt_ids
            assert a.episode.actions == b.episode.actions and a.episode.observations == b.episode.observations
            assert (a.truncated, a.episode.submitted, a.episode.calls) == (
                b.truncated,
                b.episode.submitted,
                b.episode.calls,
            )
            continue
        k = first_difference(a.completion_ids, b.completion_ids)
        assert k < min(len(a.completion_ids), len(b.completion_ids)) and b.env_mask[k] == 1, (
            "diverged outside a model token"
        )
        assert a.env_mask[:k] == b.env_mask[:k]
        assert tie_at(model, b.prompt_ids + b.completion_ids[:k], {a.completion_ids[k], b.completion_ids[k]})
        ties += 1
    turns = Counter(len(r.episode.actions) for r in theirs)
    ends = Counter(
        "submitted"
        if r.episode.submitted
        else "eos"
        if r.completion_ids[-1:] == [tokenizer.eos_token_id]
        else "budget"
        if len(r.completion_ids) >= max_tokens
        else "turns"
        for r in theirs
    )
    print(f"max_tokens {max_tokens}: turns {dict(turns)}, ends {dict(ends)}, mismatches at ties {ties}")
    assert len(turns) > 1 and len(ends) > 1, "episodes of different lengths and ends: ragged appends are exercised"


def test_session_appends_ragged_tokens_and_matches_a_fresh_encoding() -> None:
    """After ragged appends (one row's much longer than the others', one row's empty) and rows
    leaving the batch, a session's next greedy tokens equal HF `generate` over each row's whole
    context encoded from scratch; once the long row has left, its columns are holes in every
    remaining row and the session squeezes them out."""
    model, tokenizer, domain = policy("sample")
    prompts = PromptFormat().encode(tokenizer, [t.prompt for t in domain.tasks("val")[:6]])
    eos, pad = [tokenizer.eos_token_id], tokenizer.pad_token_id
    session = Session.of(model, prompts, pad)
    contexts = [list(p) for p in prompts]
    extras = ["12+34-56=78;" * 4, "", "34=", "5", "6789;", "+"]
    more = tokenizer(extras, add_special_tokens=False)["input_ids"]
    ties = 0
    for leaving in (None, None, 0, 1):  # row 0's long append enters the cache in the second decode
        if leaving is not None:
            kept = [k for k in range(len(contexts)) if k != leaving]
            session.keep(kept)
            contexts, more = [contexts[k] for k in kept], [more[k] for k in kept]
        columns = session.length
        rows = session.decode(5, eos, do_sample=False)
        if leaving == 0:  # row 0's 48 columns were holes in every row left: squeezed out
            assert session.length < columns
        ties += count_ties(model, contexts, rows, hf_generate_ids(model, contexts, 5, eos, pad, False))
        for context, row, extra in zip(contexts, rows, more, strict=True):
            context += row + extra
        session.append(more)
    ties += count_ties(
        model, contexts, session.decode(5, eos, do_sample=False), hf_generate_ids(model, contexts, 5, eos, pad, False)
    )
    print(f"session: greedy mismatches at ties {ties}")


# --- GRPO ---------------------------------------------------------------------------------------


def test_supports_only_what_it_computes_exactly() -> None:
    model, _, _ = policy("sample")
    assert supports(model)
    assert not supports(copy.deepcopy(model).double())  # not float32
    adapted = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules=["q_proj"]))
    assert not supports(adapted) and not supports(adapted.base_model.model)  # wrapper, and injected layers
    penalized = copy.deepcopy(model)
    penalized.generation_config.repetition_penalty = 1.3
    assert not supports(penalized)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model, tokenizer, domain = policy("sample")
    recipe = template_config("sample").recipe
    prompts = [t.prompt for t in domain.tasks("val")[:8]]
    return worker.FilteringGRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=worker.grpo_args(recipe, tmp_path_factory.mktemp("grpo"), [1.0]),
        train_dataset=Dataset.from_dict({"prompt": prompts}),
    )


def test_grpo_generation_uses_the_sampler_and_cuts_as_trl_does(trainer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Supported and plain: the sampler runs, and each completion ends at its first EOS or runs
    the whole budget, as TRL's own cut leaves it. With the same seed, TRL's own path draws the
    same tokens: both take one multinomial draw a step over the same probabilities, so only a
    draw within float rounding of a category boundary may differ (~1e-7 of draws), while a
    sampler that computed other probabilities would agree on few of 64 completions."""
    tokenizer = trainer.processing_class
    tasks = policy("sample")[2].tasks("val")[:8]
    prompt_ids = PromptFormat().encode(tokenizer, [t.prompt for t in tasks for _ in range(8)])  # 8 prompts x 8
    calls: list[int] = []

    def counted(*args: Any, **kw: Any) -> list[list[int]]:
        calls.append(len(args[1]))
        return generate_ids(*args, **kw)

    monkeypatch.setattr(worker, "generate_ids", counted)
    torch.manual_seed(7)
    ours, logprobs = trainer._generate_single_turn(prompt_ids, None, {}, 8)
    assert calls == [len(prompt_ids)] and logprobs is None
    budget, eos = trainer.generation_config.max_new_tokens, set(trainer.eos_token_ids)
    for row in ours:
        stops = [k for k, t in enumerate(row) if t in eos]
        assert stops in ([], [len(row) - 1]) and (stops or len(row) == budget)
    assert 0 < sum(row[-1] in eos for row in ours) < len(ours), "some completions end by EOS, some by the budget"
    torch.manual_seed(7)
    theirs, _ = GRPOTrainer._generate_single_turn(trainer, prompt_ids, None, {}, 8)
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    print(f"GRPO generation: {same} of {len(ours)} completions drawn identically by TRL's own path")
    assert same >= 0.9 * len(ours)


def test_grpo_generation_falls_back_to_trl_when_not_plain(trainer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    monkeypatch.setattr(
        GRPOTrainer, "_generate_single_turn", lambda self, *a, **kw: (seen.append("trl"), ([], None))[1]
    )
    monkeypatch.setattr(worker, "generate_ids", lambda *a, **kw: seen.append("sampler") or [])
    prompt_ids = [[1, 2, 3]]
    trainer._generate_single_turn(prompt_ids, None, {}, 1)
    monkeypatch.setattr(trainer.generation_config, "top_k", 50)
    trainer._generate_single_turn(prompt_ids, None, {}, 1)
    monkeypatch.setattr(trainer.generation_config, "top_k", 0)
    monkeypatch.setattr(trainer, "use_transformers_continuous_batching", True)
    trainer._generate_single_turn(prompt_ids, None, {}, 1)
    assert seen == ["sampler", "trl", "trl"]
