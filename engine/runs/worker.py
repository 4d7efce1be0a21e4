"""The run worker: ``python -m engine.runs.worker RUN_DIR``.

One child process per run, so a crash or an out-of-memory in training never takes the engine
down and accelerator memory is freed when it exits. It reads ``spec.json``, trains or warms up
or evaluates, and reports only through files in RUN_DIR (see `engine.runs.artifacts`).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset
from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOConfig, GRPOTrainer
from trl.extras.profiling import profiling_context
from trl.trainer.utils import RepeatSampler

from engine import faults
from engine.config import CollapseGuardConfig, DataConfig, RecipeConfig
from engine.domains import Domain, make_domain
from engine.policy.pretrained import (
    POINTER_FILE,
    PromptFormat,
    is_adapter,
    load_model,
    load_policy,
    peft_config,
    save_pointer,
    save_policy,
)
from engine.policy.sampler import generate_ids, plain_sampling, supports
from engine.policy.tiny import build_tiny_policy, warmup_policy
from engine.runs import checkpoint_state, lock
from engine.runs.artifacts import EVENTS_FILE, EventLog, write_rollouts
from engine.runs.continuation import checkpoint_step, keep, last_checkpoint
from engine.runs.evaluate import evaluate, sample_groups
from engine.runs.group_filter import GroupFilter
from engine.runs.guard import CollapseGuard, step_stats
from engine.runs.launch import device, generation_args, is_main_process
from engine.runs.recorder import RolloutRecorder
from engine.runs.spec import RunSpec

#: Where TRL keeps the run's checkpoints (``checkpoint-STEP``), the points a relaunched worker resumes from.
TRAINER_DIR = "trainer"


def _evaluate_and_log(spec: RunSpec, run_dir: Path, events: EventLog, model: Any, tokenizer: Any, step: int) -> None:
    cfg = spec.config
    domain = make_domain(cfg.domain, spec.workspace)
    # Val, and for a leaky environment val again clean (split "clean", for the leak check); an
    # eval run of the test split plays test clean, and in a leaky environment test again leaky
    # (split "test_leaky": what the policy would score where the fix sits in the history). The
    # second replay plays only the tasks the leak touches and reuses the first one's episodes of
    # the rest, whose environment is the same either way.
    leaky = getattr(domain, "leaky", False)
    first = None
    if spec.split == "test":
        replays: tuple[bool, ...] = (True, False) if leaky else (True,)
    else:
        replays = (False, True) if leaky else (False,)
    for clean in replays:
        result = evaluate(
            model,
            tokenizer,
            domain,
            cfg.recipe.rewards,
            max_new_tokens=cfg.eval.max_completion_length,
            sampled_seeds=cfg.eval.sampled_seeds,
            temperature=cfg.eval.temperature,
            run_id=spec.run_id,
            step=step,
            seed=cfg.recipe.seed,
            clean=clean,
            split=spec.split,
            fmt=PromptFormat.of(cfg.policy, domain),
            replay_of=first,
        )
        if first is None:
            first = result
        for batch in (result.greedy, result.sampled):
            file = write_rollouts(run_dir, f"{batch.split}-{batch.decoding}-{step:06d}", batch)
            events.write("rollouts", step=step, split=batch.split, file=file, rows=len(batch))
            faults.point("eval")
        events.write("metrics", step=step, values=result.metrics)


def run_warmup(spec: RunSpec, run_dir: Path, events: EventLog) -> None:
    """Build v0: the embedded policy with its supervised warm-up, or a pretrained model, warmed up
    only when asked (`WorkspaceConfig.warmup_steps`; else v0 is a pointer to it, not a copy)."""
    cfg = spec.config
    domain = make_domain(cfg.domain, spec.workspace)
    fmt = PromptFormat.of(cfg.policy, domain)
    assert spec.model_out is not None
    if cfg.policy.pretrained is None:
        model, tokenizer = build_tiny_policy(cfg.policy.embedded, domain, seed=cfg.policy.warmup.seed)
    else:
        model, tokenizer = load_model(cfg.policy.pretrained, cfg.policy.dtype)
    model.to(device())
    steps = cfg.warmup_steps
    events.write("start", total_steps=steps, parameters=model.num_parameters(), threads=torch.get_num_threads())
    if steps:
        every = max(1, steps // 50)

        def on_step(step: int, loss: float) -> None:
            if step % every == 0 or step == steps:
                events.write("metrics", step=step, values={"warmup/loss": loss})
            faults.point("warmup-step")

        stats = warmup_policy(model, tokenizer, domain, cfg.policy.warmup, on_step=on_step, fmt=fmt)
        events.write("warmup", steps=stats.steps, final_loss=stats.final_loss, seconds=stats.seconds)
        save_policy(model, tokenizer, spec.model_out)
    else:
        save_pointer(cfg.policy, spec.model_out)
    # What GRPO would see from v0, so that round 1 diagnoses rollouts on every layer.
    groups = sample_groups(model, tokenizer, domain, cfg.recipe, cfg.policy.warmup.baseline_steps, spec.run_id, fmt)
    for batch in groups:
        file = write_rollouts(run_dir, f"train-{batch.step:06d}", batch)
        events.write("rollouts", step=batch.step, split="train", file=file, rows=len(batch))
    _evaluate_and_log(spec, run_dir, events, model, tokenizer, steps)


def grpo_args(
    recipe: RecipeConfig,
    output_dir: Path,
    reward_weights: list[float],
    report_to: list[str] | None = None,
    run_name: str | None = None,
    machine: dict[str, Any] | None = None,
    start: int = 0,
) -> GRPOConfig:
    """TRL's GRPOConfig for a recipe: one generation batch per optimizer step, logged every step
    (to `report_to`'s trackers too, under `run_name`), checkpointed every `save_every` steps; on
    the machine `machine` describes (`launch.generation_args`: the CPU in float32 when left out,
    else CUDA with bf16 and vLLM generation where they apply). A continuation starts at TRL's global
    step `start` (its parent's last) and trains `recipe.steps` more."""
    machine = machine or {"use_cpu": True, "bf16": False, "use_vllm": False}
    return GRPOConfig(
        output_dir=str(output_dir),
        max_steps=start + recipe.steps,
        per_device_train_batch_size=recipe.batch_size,
        num_generations=recipe.num_generations,
        learning_rate=recipe.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        loss_type=recipe.loss_type,
        epsilon=recipe.epsilon,
        epsilon_high=recipe.epsilon_high,
        num_iterations=recipe.num_iterations,
        beta=recipe.beta,
        temperature=recipe.temperature,
        top_k=0,
        max_completion_length=recipe.max_completion_length,
        scale_rewards=recipe.scale_rewards,
        reward_weights=reward_weights,
        seed=recipe.seed,
        logging_steps=1,
        # TRL's own checkpoints (model, optimizer, scheduler, RNG, trainer state): a relaunched
        # worker resumes from the latest (`run_train`).
        save_strategy="steps" if recipe.save_every else "no",
        save_steps=recipe.save_every or 500,
        save_total_limit=recipe.keep_checkpoints,
        report_to=report_to or "none",
        run_name=run_name,
        disable_tqdm=True,
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        **machine,
    )


def trackers(report_to: list[str]) -> list[str]:
    """`[tracking] report_to`, checked against the trackers transformers knows and has installed."""
    from transformers.integrations import INTEGRATION_TO_CALLBACK, get_available_reporting_integrations

    unknown = [name for name in report_to if name not in INTEGRATION_TO_CALLBACK]
    if unknown:
        known = ", ".join(INTEGRATION_TO_CALLBACK)
        raise ValueError(f"tracking.report_to: unknown tracker(s) {unknown}; known: {known}")
    missing = [name for name in report_to if name not in get_available_reporting_integrations()]
    if missing:
        raise ValueError(f"tracking.report_to: {missing} not installed here; `pip install` the tracker's package")
    return report_to


def grpo_dataset(domain: Domain, data: DataConfig, fmt: PromptFormat | None = None) -> Dataset:
    """The train split, minus the tasks and subsets `data` leaves out, as a TRL prompt dataset
    (conversational for a chat-template policy); `task_id` reaches the reward functions."""
    fmt = fmt or PromptFormat()
    tasks, ids, subsets = domain.tasks("train"), set(data.exclude_tasks), set(data.exclude_subsets)
    tasks = [t for t in tasks if t.task_id not in ids and t.subset not in subsets]
    if not tasks:
        raise ValueError(
            f"data.exclude_tasks ({len(ids)} ids) and data.exclude_subsets ({sorted(subsets)}) leave out all"
            " train tasks: nothing to train on"
        )
    return Dataset.from_dict(
        {"prompt": [fmt.dataset_prompt(t.prompt) for t in tasks], "task_id": [t.task_id for t in tasks]}
    )


def run_start(spec: RunSpec) -> int:
    """TRL's global step at the run's start: its parent's last for a continuation, else 0. The
    steps the run records count from it (1..recipe.steps); TRL's own count from the lineage's start."""
    return checkpoint_step(spec.resume_from) if spec.resume_from is not None else 0


def build_grpo_trainer(spec: RunSpec, run_dir: Path, events: EventLog) -> FilteringGRPOTrainer:
    """A TRL GRPOTrainer for the spec's recipe, recording every rollout and step metric."""
    assert spec.model_in is not None
    cfg = spec.config
    recipe = cfg.recipe
    start = run_start(spec)
    domain = make_domain(cfg.domain, spec.workspace)
    fmt = PromptFormat.of(cfg.policy, domain)
    # A child of a LoRA version trains on its parent's adapter; the first LoRA version gets a new one.
    continues = is_adapter(spec.model_in)
    model, tokenizer = load_policy(spec.model_in, cfg.policy.dtype, trainable=continues)
    lora = peft_config(cfg.policy.lora) if cfg.policy.lora is not None and not continues else None
    recorder = RolloutRecorder(
        spec.run_id, run_dir, domain, recipe.rewards, recipe.num_generations, [tokenizer.eos_token_id], events, start
    )
    guard = _GuardCallback(recipe, recorder, events)
    guard.start = start
    # TRL builds the KL term's reference from the name the policy was loaded under (a LoRA policy's
    # is its base with the adapter off, the same for every segment): a continuation's is the one its
    # lineage's first segment started from, as in one long run.
    name = model.config.name_or_path
    if recipe.beta and spec.reference is not None and not continues:
        model.config.name_or_path = _source(spec.reference)
    trainer = FilteringGRPOTrainer(
        model=model,
        processing_class=tokenizer,
        reward_funcs=recorder.reward_functions(),
        args=grpo_args(
            recipe,
            run_dir / TRAINER_DIR,
            recorder.reward_weights,
            report_to=trackers(cfg.tracking.report_to),
            run_name=spec.run_id,
            machine=generation_args(cfg.compute, cfg.policy.dtype),
            start=start,
        ),
        train_dataset=grpo_dataset(domain, cfg.data, fmt),
        peft_config=lora,
        callbacks=[_EventCallback(spec, run_dir, events, tokenizer, start), guard, _Rate(recipe.learning_rate)],
        # Multi-turn domains play episodes: environment tokens are masked out of the loss (env_mask).
        rollout_func=recorder.rollout_function(recipe.max_completion_length, recipe.temperature)
        if recorder.agentic
        else None,
        group_filter=GroupFilter.from_config(recipe.group_filter),
        recorder=recorder,
        guard=guard.guard,
    )
    model.config.name_or_path = name
    return trainer


def _source(model_dir: Path) -> str:
    """What a version's model directory is loaded from: itself, or the model its pointer names
    (a pretrained v0 without a warm-up, `save_pointer`)."""
    pointer = model_dir / POINTER_FILE
    return json.loads(pointer.read_text(encoding="utf-8"))["name_or_path"] if pointer.is_file() else str(model_dir)


class FilteringGRPOTrainer(GRPOTrainer):
    """TRL's GRPOTrainer with the dead-group aware group filter: after TRL scores a generation
    batch, the completions of dropped groups leave the loss mask (and the token count that
    normalizes the loss), so they neither move the policy nor dilute the groups that do.

    Each checkpoint also keeps the filter's and the collapse guard's state at its step
    (`engine.runs.checkpoint_state`), and `restore_checkpoint_state` puts it back on resume."""

    #: The rows of the batch being generated: a `rollout_func` gets only prompts from TRL.
    current_inputs: list[dict[str, Any]] = []

    def __init__(
        self,
        *args: Any,
        group_filter: GroupFilter | None = None,
        recorder: RolloutRecorder | None = None,
        guard: CollapseGuard | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.group_filter = group_filter
        self.recorder = recorder
        self.guard = guard if guard is not None else CollapseGuard(CollapseGuardConfig(enabled=False))

    def _state_file(self, checkpoint: Path) -> Path:
        return checkpoint_state.state_file(checkpoint, self.args.process_index, self.args.world_size)

    def _get_train_sampler(self, dataset: Any = None) -> Any:
        sampler = super()._get_train_sampler(dataset)
        return EpochSampler.like(sampler) if isinstance(sampler, RepeatSampler) else sampler

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        # First, so that it is in every checkpoint transformers marks whole: it writes
        # `trainer_state.json` last (see `last_checkpoint`).
        folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        checkpoint_state.save(self._state_file(folder), self.state.global_step, self.guard, self.group_filter)
        super()._save_checkpoint(model, trial)

    def restore_checkpoint_state(self, checkpoint: Path) -> None:
        """The filter and the guard as they were at `checkpoint`'s step; the steps after it are
        replayed and observed again."""
        step = int(checkpoint.name.rpartition("-")[2])
        checkpoint_state.restore(self._state_file(checkpoint), step, self.guard, self.group_filter)

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        self.current_inputs = inputs
        output = super()._generate_and_score_completions(inputs)
        if self.group_filter is None or self.recorder is None or not self.model.training:
            return output
        assert self.recorder.last_batch is not None  # the reward functions just wrote it
        rewards = np.asarray(self.recorder.last_batch.reward, dtype=float).reshape(-1, self.num_generations)
        keep = self.group_filter.keep(rewards.std(axis=1))
        rows = torch.as_tensor(np.repeat(keep, self.num_generations), device=output["completion_mask"].device)
        output["completion_mask"] = output["completion_mask"] * rows.unsqueeze(1).int()
        loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        self._metrics["train"]["filter/keep_ratio"].append(float(keep.mean()))
        self._metrics["train"]["filter/threshold"].append(self.group_filter.threshold)
        return output

    def _generate_single_turn(
        self,
        prompt_ids: list[list[int]],
        images: Any,
        multimodal_fields: dict[str, Any],
        num_generations: int,
        has_tool_images: bool = False,
    ) -> tuple[list[list[int]], list[list[float]] | None]:
        """TRL's single-turn generation, through `engine.policy.sampler` where that computes the
        same thing ~3x faster: a supported model (the embedded policy) on one process, text only,
        plain sampling (what `grpo_args` configures). Each completion is cut after its first EOS
        among `eos_token_ids`, as TRL's own path cuts it; no logprobs, as TRL's own path gives."""
        model = self.accelerator.unwrap_model(self.model)
        fast = (
            not self.use_vllm
            and not self.use_transformers_continuous_batching
            and not self.is_deepspeed_enabled
            and not self.is_fsdp_enabled
            and images is None
            and not multimodal_fields
            and supports(model)
            and plain_sampling(self.generation_config, model.generation_config)
        )
        if not fast:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, has_tool_images=has_tool_images
            )
        config = self.generation_config
        with profiling_context(self, "sampler.generate"):
            completion_ids = generate_ids(
                model,
                prompt_ids,
                config.max_new_tokens,
                self.eos_token_ids,
                self._tokenizer.pad_token_id,
                do_sample=True,
                temperature=config.temperature,
            )
        return completion_ids, None


class EpochSampler(RepeatSampler):
    """TRL's RepeatSampler, whose order in epoch E is the same however the run reached E.

    TRL draws each epoch's permutation of the train prompts from one generator seeded once, when
    the trainer is built; a checkpoint does not keep it. A run resumed in epoch E > 0 (a
    continuation, a relaunched worker) would draw epoch 0's order again, and train on other prompts
    than the uninterrupted run. transformers calls `set_epoch` before each epoch: the generator is
    put where the uninterrupted run has it then (seeded, E permutations drawn), which leaves that
    run's order as it was."""

    @classmethod
    def like(cls, sampler: RepeatSampler) -> EpochSampler:
        return cls(
            sampler.data_source,
            sampler.mini_repeat_count,
            sampler.batch_size,
            sampler.repeat_count,
            sampler.shuffle,
            sampler.seed,
        )

    def set_epoch(self, epoch: int) -> None:
        if self.shuffle and self.seed is not None:
            self.generator.manual_seed(self.seed)
            for _ in range(epoch):
                torch.randperm(self.num_samples, generator=self.generator)


class _Rate(TrainerCallback):
    """The recipe's learning rate from the first step on, also where a continuation restored its
    parent's optimizer and scheduler, which carry the parent's rate (`continuation.RESUMABLE`).
    transformers restores them before `on_train_begin`; the schedule is constant, so the
    scheduler's base rate is the rate of every step."""

    def __init__(self, learning_rate: float):
        self.learning_rate = learning_rate

    def on_train_begin(
        self, args: Any, state: Any, control: Any, optimizer: Any = None, lr_scheduler: Any = None, **kw: Any
    ) -> None:
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] = self.learning_rate
        scheduler = getattr(lr_scheduler, "scheduler", lr_scheduler)  # accelerate's wrapper, or the scheduler
        scheduler.base_lrs = [self.learning_rate] * len(scheduler.base_lrs)
        # Else the first step logs the parent's rate: the scheduler has not stepped yet when it is read.
        scheduler._last_lr = [self.learning_rate] * len(scheduler.base_lrs)


class _EventCallback(TrainerCallback):
    """Per-step metrics (TRL's names) into the event log, and evaluation every K steps. Steps are
    the run's own, counted from TRL's global step `start` (a continuation's parent's last)."""

    def __init__(self, spec: RunSpec, run_dir: Path, events: EventLog, tokenizer: Any, start: int = 0):
        self.spec = spec
        self.run_dir = run_dir
        self.events = events
        self.tokenizer = tokenizer
        self.start = start

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.events.write("start", total_steps=state.max_steps - self.start, threads=torch.get_num_threads())

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
        if not logs:
            return
        values = {k: float(v) for k, v in logs.items() if isinstance(v, int | float)}
        kind = "summary" if "train_runtime" in logs else "metrics"
        self.events.write(kind, step=state.global_step - self.start, values=values)

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        faults.point("grpo-step")  # before this step's checkpoint is saved
        if state.global_step >= state.max_steps:
            control.should_save = True  # whatever `save_every` says: the last step is the version's resume point
        step = state.global_step - self.start
        every = self.spec.config.recipe.eval_every
        if (
            every
            and state.is_world_process_zero
            and step % every == 0
            and state.global_step < state.max_steps
            and model is not None
        ):
            _evaluate_and_log(self.spec, self.run_dir, self.events, model, self.tokenizer, step)


class _GuardCallback(TrainerCallback):
    """The collapse guard on each step's train episodes (multi-turn domains): ends training
    early, saves a checkpoint at the step it stopped at (which keeps the stop), then writes a
    `stopped` event that says why."""

    #: TRL's global step at the run's start (`run_start`; `build_grpo_trainer` sets it): the
    #: `stopped` event's step is the run's own.
    start = 0

    def __init__(self, recipe: RecipeConfig, recorder: RolloutRecorder, events: EventLog):
        self.guard = CollapseGuard(recipe.collapse_guard)
        self.group = recipe.num_generations
        self.recorder = recorder
        self.events = events
        self.seen: int | None = None
        self.announced = False

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        batch = self.recorder.last_batch
        if not self.recorder.agentic or batch is None or batch.step == self.seen:
            return
        self.seen = batch.step
        correct = [c.get("correctness", 0.0) for c in batch.reward_components]
        if self.guard.observe(step_stats(batch.num_turns, correct, batch.completion, self.group)) is not None:
            control.should_training_stop = True
            control.should_save = True  # whatever `save_every` says: the stop is kept with this step's weights

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        # Only once the checkpoint that keeps the stop is whole: a worker killed before then
        # resumes from an earlier checkpoint and replays, so the engine never records a stop
        # that its run has not kept.
        if self.guard.stopped is not None and not self.announced:
            self.events.write("stopped", step=state.global_step - self.start, reason=self.guard.stopped)
            self.announced = True


def run_train(spec: RunSpec, run_dir: Path, events: EventLog, resuming: bool = False) -> None:
    """GRPO from the spec's checkpoint, or for a continuation (`spec.resume_from`) from its parent's
    final TRL checkpoint, `recipe.steps` more steps; a relaunched worker (`resuming`) goes on from
    TRL's latest checkpoint of this run (a continuation without one yet: from its parent's again),
    with the collapse guard and the group filter as they were at its step, and says from which of
    the run's steps in a `resume` event (-1: from the start). A run the guard stopped stays stopped:
    it goes on to the evaluation, and says again why it stopped. A run that trained to its end
    keeps its final checkpoint in its version's model directory (`continuation.keep`): the point a
    continuation of the version resumes from."""
    assert spec.model_in is not None and spec.model_out is not None
    # Every rank resumes from the same checkpoint (a fresh run has none); rank 0 says so.
    own = last_checkpoint(run_dir / TRAINER_DIR)
    checkpoint = own or spec.resume_from
    start = run_start(spec)
    step = checkpoint_step(own) - start if own is not None else -1
    trainer = build_grpo_trainer(spec, run_dir, events)
    if checkpoint is not None:
        trainer.restore_checkpoint_state(checkpoint)
    stopped = trainer.guard.stopped
    final = step >= spec.config.recipe.steps or stopped is not None
    if resuming:
        events.write("resume", step=step, final=final)
    if final:  # trained to the end before, or stopped: the weights, and on to the evaluation
        if stopped is not None:  # the worker may have died between the stop's checkpoint and its event
            events.write("stopped", step=step, reason=stopped)
        trainer._load_from_checkpoint(str(checkpoint))
    else:
        trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
        step = trainer.state.global_step - start
    if not is_main_process():
        return
    if trainer.guard.stopped is None:  # a run the guard stopped is not continued
        last = last_checkpoint(run_dir / TRAINER_DIR)
        assert last is not None and checkpoint_step(last) == start + step, (last, start + step)
        keep(last, spec.model_out)
    save_policy(trainer.model, trainer.processing_class, spec.model_out)
    events.write("checkpoint", path=str(spec.model_out), step=step)
    _evaluate_and_log(spec, run_dir, events, trainer.model, trainer.processing_class, step)


def run_eval(spec: RunSpec, run_dir: Path, events: EventLog) -> None:
    assert spec.model_in is not None
    model, tokenizer = load_policy(spec.model_in, spec.config.policy.dtype)
    model.to(device())
    events.write("start", total_steps=0, threads=torch.get_num_threads())
    _evaluate_and_log(spec, run_dir, events, model, tokenizer, 0)


def _cpu_seconds() -> float:
    """User and system CPU of this worker and its finished children (sandboxed tests, say)."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m engine.runs.worker RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    spec = RunSpec.load(run_dir)
    main_rank = is_main_process()  # several GPUs: rank 0 holds the run and writes what it records
    try:
        held = lock.acquire(run_dir) if main_rank else None  # noqa: F841 - held until this process exits
    except lock.RunLocked as exc:
        print(f"{exc}: not starting a second one", file=sys.stderr)
        return lock.EXIT_LOCKED
    # An earlier worker of this run was stopped before its end: its events stand (the engine may
    # have ingested them); what this one redoes is announced by a `resume` event.
    path = run_dir / EVENTS_FILE
    resuming = path.exists() and path.stat().st_size > 0
    events = EventLog(path if main_rank else None)
    try:
        if spec.threads:
            torch.set_num_threads(spec.threads)
        if spec.kind == "train":
            run_train(spec, run_dir, events, resuming)
        else:
            if resuming:  # a warm-up or an evaluation is redone whole
                events.write("resume", step=-1, final=False)
            {"warmup": run_warmup, "eval": run_eval}[spec.kind](spec, run_dir, events)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the engine as an event
        tail = "".join(traceback.format_exception(exc))[-4000:]
        events.write("error", message=f"{type(exc).__name__}: {exc}", traceback=tail, cpu_seconds=_cpu_seconds())
        traceback.print_exc()
        events.close()
        return 1
    events.write("end", status="succeeded", cpu_seconds=_cpu_seconds())
    events.close()
    if main_rank:  # the run's resume points are spent: the trained policy is in spec.model_out
        shutil.rmtree(run_dir / TRAINER_DIR, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental
    sys.exit(main())
