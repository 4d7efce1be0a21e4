"""`workspace.toml`: the typed configuration of a workspace, and its validation errors.

Every section is a pydantic model that forbids unknown fields, so a typo is an error that names
the file, the line, the field and what is allowed, never a silently ignored setting. Values are
strict (`enabled = "yes"` or `steps = true` is an error, not a guess; an integer is still a valid
float) and finite (TOML can spell `inf` and `nan`; no field means either).

This module is a leaf of the engine (an import-linter contract in pyproject.toml holds it to that):
what the domains need to know about their sections, such as the names of their reward components,
is defined here and the domains read it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from engine.grpo import DEAD_STD

CONFIG_FILE = "workspace.toml"
#: A workspace's own state (store, models, runs, caches), beside its config and never committed.
STATE_DIR = ".evotrainer"


class _Section(BaseModel):
    # strict: no lax coercion ("yes" -> True, 1 -> True, "300" -> 300); pydantic's strict mode
    # still takes an int for a float, as TOML's `learning_rate = 1` should be.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


#: A sampling temperature (rollouts and evaluation alike).
Temperature = Annotated[float, Field(gt=0, le=10)]
#: The weight of one reward component. Weights are relative, so a ratio of 100 to the smallest
#: sensible weight (0.1 on `format`) is far more than any recipe needs; 1e308 only overflows.
RewardWeight = Annotated[float, Field(ge=0, le=100)]


class WorkspaceMeta(_Section):
    name: str = Field(min_length=1, description="Shown in the CLI and the workbench.")
    description: str = ""


class _DomainSection(_Section):
    #: The names of the domain's reward components, in the order it scores them: the one
    #: definition that `[recipe.rewards]` is checked against and that the domain's class builds
    #: its reward functions from (`engine.domains.reward_functions`). None: known only once the
    #: domain's code is loaded (a custom domain).
    REWARD_COMPONENTS: ClassVar[tuple[str, ...] | None]


class MathDomainConfig(_DomainSection):
    """Multi-step arithmetic: `a+b-c...` with the intermediate results written out."""

    REWARD_COMPONENTS: ClassVar[tuple[str, ...] | None] = ("correctness", "format", "closeness")

    name: Literal["math"] = "math"
    seed: int = Field(1234, description="Seed of the task generator; train, val and test are derived from it.")
    train_size: int = Field(4000, ge=1)
    val_size: int = Field(200, ge=1)
    test_size: int = Field(
        0,
        ge=0,
        description="Held-out test tasks, drawn apart from train and val: nothing that decides reads them; "
        "`evotui eval --split test` and the benchmark's report do (0: no test split).",
    )
    min_operands: int = Field(3, ge=2, le=6)
    max_operands: int = Field(4, ge=2, le=6)
    max_operand: int = Field(9, ge=1, le=999, description="Operands are drawn from 0..max_operand.")
    demo_shortcut_rate: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Share of warm-up demonstrations that state the answer without the chain.",
    )

    @model_validator(mode="after")
    def _operand_range(self) -> MathDomainConfig:
        if self.max_operands < self.min_operands:
            raise ValueError(f"max_operands ({self.max_operands}) must be >= min_operands ({self.min_operands})")
        return self


class CodeDomainConfig(_DomainSection):
    """Small Python functions judged by unit tests run in the sandbox (`engine/domains/code.py`)."""

    REWARD_COMPONENTS: ClassVar[tuple[str, ...] | None] = ("correctness", "pass_fraction", "format")

    name: Literal["code"] = "code"
    seed: int = Field(1234, description="Seed of the task generator; train, val and test are derived from it.")
    train_size: int = Field(2000, ge=1)
    val_size: int = Field(200, ge=1)
    test_size: int = Field(
        0,
        ge=0,
        description="Held-out test tasks, drawn apart from train and val: nothing that decides reads them; "
        "`evotui eval --split test` and the benchmark's report do (0: no test split).",
    )
    demo_flaw_rate: float = Field(
        0.3,
        ge=0,
        le=1,
        description="Share of warm-up demonstrations whose code is subtly wrong (off-by-one constant, "
        "wrong comparison), so v0 is only partly competent.",
    )
    demo_unclosed_rate: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Share of warm-up demonstrations that leave the code block open (the format gate fires).",
    )
    timeout_seconds: float = Field(
        2.0, gt=0, le=60, description="Wall-clock limit of one sandboxed test run (all tests of one completion)."
    )

    @model_validator(mode="after")
    def _rates_fit(self) -> CodeDomainConfig:
        if self.demo_flaw_rate + self.demo_unclosed_rate > 1:
            raise ValueError(
                f"demo_flaw_rate ({self.demo_flaw_rate}) + demo_unclosed_rate ({self.demo_unclosed_rate}) "
                "must be <= 1: they are shares of the same demonstrations"
            )
        return self


class CustomDomainConfig(_DomainSection):
    """A domain written by the user in `<workspace>/domains/<module>.py` (see docs/custom_domains.md)."""

    #: Checked against the module's own `reward_components` when it is loaded (`load_custom_domain`).
    REWARD_COMPONENTS: ClassVar[tuple[str, ...] | None] = None

    name: Literal["custom"] = "custom"
    module: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="File stem under <workspace>/domains: module = 'reverse' loads domains/reverse.py.",
    )
    seed: int = Field(0, description="Passed to the module's make_domain(seed, options) factory.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Passed to the module's make_domain(seed, options) factory."
    )


#: Verifiers a dataset domain names (`python:module:function` names the user's own).
DATASET_VERIFIERS = ("exact", "numeric", "math", "regex")


def _workspace_path(value: Path | None, info: ValidationInfo) -> Path | None:
    """A path of the config made absolute: relative to the workspace, wherever evotui is started from."""
    if value is None:
        return None
    root = (info.context or {}).get("root")
    return (Path(root) / value if root is not None else Path(value)).resolve()


class DatasetDomainConfig(_DomainSection):
    """Prompts with reference answers from your own files (JSONL, Parquet or CSV), scored by a
    standard verifier: `exact`, `numeric`, `math` (math-verify), `regex`, or
    `python:module:function` (see docs/your_model.md)."""

    REWARD_COMPONENTS: ClassVar[tuple[str, ...] | None] = ("correctness", "format", "closeness")

    name: Literal["dataset"] = "dataset"
    train: Path | None = Field(None, strict=False, description="Train file (relative to the workspace).")
    val: Path | None = Field(None, strict=False, description="Val file: every decision reads it.")
    test: Path | None = Field(None, strict=False, description="Test file: held out from every decision.")
    file: Path | None = Field(
        None, strict=False, description="One file split by `seed` into val, test and train (instead of the three)."
    )
    val_fraction: float = Field(0.1, gt=0, lt=1, description="`file`: the share of rows that become val.")
    test_fraction: float = Field(0.1, ge=0, lt=1, description="`file`: the share of rows that become test.")
    seed: int = Field(1234, description="`file`: the seed of the split.")
    prompt_field: str = Field("prompt", min_length=1)
    answer_field: str = Field("answer", min_length=1)
    id_field: str | None = Field(None, min_length=1, description="A field of unique row ids (unset: file:line).")
    completion_field: str | None = Field(
        None, min_length=1, description="Reference completions: the warm-up's demonstrations, when one is asked for."
    )
    subset_field: str | None = Field(None, min_length=1, description="A field that groups rows for per-subset scores.")
    system_prompt: str = Field("", description="A system message before each prompt (chat-template policies).")
    verifier: str = Field("exact", description="exact | numeric | math | regex | python:module:function")
    tolerance: float = Field(
        1e-6, ge=0, description="`numeric`: the largest accepted |answer - reference| / max(1, |reference|)."
    )
    answer_pattern: str | None = Field(
        None,
        description="A regex whose last match's group 1 (or whole match) is the completion's answer. Unset: "
        "the content of the last \\boxed{...}, else what follows the last '####' or 'Answer:', else (numeric) "
        "the last number.",
    )
    train_size: int | None = Field(None, ge=1, description="Use at most this many train rows (unset: all).")
    val_size: int | None = Field(None, ge=1, description="Use at most this many val rows (unset: all).")
    test_size: int | None = Field(None, ge=0, description="Use at most this many test rows (unset: all; 0: none).")

    @field_validator("train", "val", "test", "file")
    @classmethod
    def _exists(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        path = _workspace_path(value, info)
        if path is not None and not path.is_file():
            raise ValueError(f"{str(value)!r} is not a file (paths are relative to the workspace)")
        return path

    @field_validator("verifier")
    @classmethod
    def _known_verifier(cls, value: str) -> str:
        if value in DATASET_VERIFIERS or re.fullmatch(r"python:[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
            return value
        raise ValueError(f"unknown verifier; use one of {', '.join(DATASET_VERIFIERS)} or python:module:function")

    @field_validator("answer_pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _one_source(self) -> DatasetDomainConfig:
        if self.file is not None and (self.train or self.val or self.test):
            raise ValueError("give either file = '...' (split by seed) or train/val/test, not both")
        if self.file is None and (self.train is None or self.val is None):
            raise ValueError("name the data: train = '...' and val = '...' (test optional), or file = '...'")
        if self.file is not None and self.val_fraction + self.test_fraction >= 1:
            raise ValueError("val_fraction + test_fraction must leave rows for train (their sum is >= 1)")
        return self


class SweDomainConfig(_DomainSection):
    """Multi-turn bug fixing in tiny generated repositories with tools, visible and hidden tests."""

    #: Episode rewards (`SweDomain.episode_rewards`); behavior rewards are components like any other.
    REWARD_COMPONENTS: ClassVar[tuple[str, ...] | None] = (
        "correctness",
        "pass_fraction",
        "search_before_edit",
        "edit_then_test",
        "efficiency",
        "invalid_penalty",
        "judge",
    )

    name: Literal["swe"] = "swe"
    seed: int = Field(1234, description="Seed of the repository generator; train, val and test are derived from it.")
    train_size: int = Field(2000, ge=1)
    val_size: int = Field(200, ge=1)
    test_size: int = Field(
        0,
        ge=0,
        description="Held-out test tasks, drawn apart from train and val: nothing that decides reads them; "
        "`evotui eval --split test` and the benchmark's report do (0: no test split).",
    )
    max_turns: int = Field(10, ge=2, le=40, description="Actions per training episode (at least an edit and a submit).")
    eval_max_turns: int | None = Field(
        None,
        ge=2,
        le=40,
        description="Actions per evaluation episode (val, its clean replay, test): part of the evaluation protocol, "
        "like [eval] max_completion_length, so that a version whose recipe raised max_turns is judged with the "
        "turns its parent was judged with: a verdict compares policies, not turn budgets. Unset: max_turns.",
    )
    leak_fix_in_history: bool = Field(
        False,
        description="Leave each bug's fix in the git history as the newest commit (on another branch), so "
        "`git log` then `git show` reveals it: the leak the harness must catch. Evaluation ignores it.",
    )
    leak_rate: float = Field(
        1.0, ge=0, le=1, description="Share of tasks whose history holds the fix when leak_fix_in_history is on."
    )
    judge: Literal["rubric", "claude"] = Field(
        "rubric",
        description="The `judge` reward: the offline protocol rubric, or Claude (needs ANTHROPIC_API_KEY; "
        "an episode it cannot score falls back to the rubric).",
    )
    judge_model: str = Field("claude-sonnet-4-5", description="Model of the Claude judge.")


#: The `[domain]` section: its `name` picks the kind.
DomainConfig = Annotated[
    MathDomainConfig | CodeDomainConfig | SweDomainConfig | CustomDomainConfig | DatasetDomainConfig,
    Field(discriminator="name"),
]
#: Each kind's section by its `name`, read off `DomainConfig` so that a new kind is added in one place.
DOMAIN_SECTIONS: dict[str, type[_DomainSection]] = {
    section.model_fields["name"].default: section for section in get_args(get_args(DomainConfig)[0])
}


class EmbeddedPolicyConfig(_Section):
    """The tiny Llama-style model built in code (no download)."""

    hidden_size: int = Field(128, ge=16)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(256, ge=16)
    max_positions: int = Field(128, ge=32)

    @model_validator(mode="after")
    def _heads_divide(self) -> EmbeddedPolicyConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        return self


class WarmupConfig(_Section):
    """Supervised warm-up that turns a random embedded model into a partly competent v0."""

    steps: int = Field(300, ge=1)
    batch_size: int = Field(128, ge=1)
    learning_rate: float = Field(3e-3, gt=0, le=1)
    seed: int = 0
    baseline_steps: int = Field(
        4,
        ge=0,
        le=64,
        description="Batches of the recipe's shape sampled from v0 on train prompts, without training, stored as "
        "its train rollouts: GRPO-time evidence (dead groups, truncation, behavior) for round 1's diagnosis.",
    )


class LoraConfig(_Section):
    """`[policy.lora]`: train LoRA adapters (peft) instead of every weight; versions save adapters."""

    r: int = Field(16, ge=1, le=1024)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="Module names to adapt (e.g. ['q_proj', 'v_proj']), or 'all-linear'."
    )


class TrackingConfig(_Section):
    """`[tracking]`: experiment trackers TRL reports each run to (the store stays the source of truth)."""

    report_to: list[str] = Field(
        default_factory=list,
        description="Tracker names as transformers knows them: 'trackio', 'wandb', 'tensorboard', 'mlflow' ...; "
        "each run is named by its run id. Install the tracker's package yourself.",
    )

    @field_validator("report_to")
    @classmethod
    def _no_none(cls, value: list[str]) -> list[str]:
        if "none" in value or "all" in value:
            raise ValueError("list the trackers by name ('none': leave the list empty; 'all' is not accepted)")
        return value


class PolicyConfig(_Section):
    kind: Literal["embedded", "hf", "local"] = Field(
        "embedded",
        description="'embedded': the tiny model built in code; 'hf': a Hugging Face causal LM (name_or_path); "
        "'local': the older spelling of 'hf' with a directory in `path`.",
    )
    name_or_path: str | None = Field(
        None, min_length=1, description="kind = 'hf': a Hub id (from the Hub cache or a network) or a directory."
    )
    path: Path | None = Field(
        None,
        strict=False,  # TOML has no path type: the string is the path
        description="A local Hugging Face causal-LM directory (kind = 'local').",
    )
    chat_template: bool = Field(
        False,
        description="Prompts as conversations through the tokenizer's chat template (as TRL treats conversational "
        "datasets); single-turn domains only.",
    )
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32", description="Weights' dtype when loading an hf policy (float32 on a CPU)."
    )
    lora: LoraConfig | None = Field(None, description="[policy.lora]: train adapters through peft (hf policies).")
    embedded: EmbeddedPolicyConfig = EmbeddedPolicyConfig()
    warmup: WarmupConfig = WarmupConfig()

    @property
    def pretrained(self) -> str | None:
        """The model v0 starts from (a directory or a Hub id), or None for the embedded policy."""
        if self.kind == "hf":
            return self.name_or_path
        return str(self.path) if self.kind == "local" else None

    @model_validator(mode="after")
    def _source(self, info: ValidationInfo) -> PolicyConfig:
        if self.kind == "local":
            if self.path is None:
                raise ValueError("kind = 'local' needs path = '<a Hugging Face causal-LM directory>'")
            path = _workspace_path(self.path, info)
            if path is None or not (path / "config.json").is_file():
                raise ValueError(f"path {str(self.path)!r} is not a Hugging Face model directory (no config.json)")
            object.__setattr__(self, "path", path)
        if self.kind == "hf":
            if self.name_or_path is None:
                raise ValueError("kind = 'hf' needs name_or_path = '<a Hub id or a model directory>'")
            local = _workspace_path(Path(self.name_or_path), info)
            if local is not None and local.is_dir():
                if not (local / "config.json").is_file():
                    raise ValueError(f"name_or_path {self.name_or_path!r} is a directory without config.json")
                object.__setattr__(self, "name_or_path", str(local))
            elif self.name_or_path.startswith((".", "/", "~")):
                raise ValueError(f"name_or_path {self.name_or_path!r}: no such directory (relative to the workspace)")
        if self.kind == "embedded" and (self.lora is not None or self.chat_template):
            raise ValueError("lora and chat_template are for pretrained policies (kind = 'hf')")
        return self


class GroupFilterConfig(_Section):
    """Dead-group aware filter of each step's GRPO groups (RAGEN/DAPO-style): a group whose reward
    std is under the threshold adds nothing but normalization mass, so it is dropped from the loss."""

    enabled: bool = False
    std_threshold: float = Field(DEAD_STD, ge=0, description="Groups with a reward std under this are dropped.")
    keep_ratio: float = Field(
        1.0, gt=0, le=1, description="Keep at most this share of groups per step, those with the largest std."
    )
    ema: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="> 0: the threshold follows an EMA of each step's median group spread (0: fixed threshold).",
    )


class CollapseGuardConfig(_Section):
    """Stops a multi-turn run early when it collapses into one-step episodes: over the last
    `window` steps, at least `one_step_share` of the episodes end after one turn (and at least
    twice the share of the first `window` steps) while correctness has not risen. The version is
    then rejected without spending the rest of its steps. Off under the score-only harness."""

    enabled: bool = True
    one_step_share: float = Field(0.3, gt=0, le=1, description="Share of a window's episodes with one turn.")
    window: int = Field(3, ge=1, description="Steps per window (the first window is the baseline).")


class RecipeConfig(_Section):
    """The GRPO-family recipe a version trains with (names follow TRL's GRPOConfig)."""

    loss_type: Literal["grpo", "dapo", "dr_grpo"] = "dapo"
    epsilon: float = Field(0.2, gt=0, le=1)
    epsilon_high: float | None = Field(0.28, gt=0, le=1)
    num_iterations: int = Field(
        1,
        ge=1,
        le=8,
        description="Optimizer passes over each generation batch (TRL's mu). With 1 the policy ratio is 1 and the"
        " clip (epsilon, epsilon_high) never binds.",
    )
    beta: float = Field(0.0, ge=0, le=10, description="KL coefficient; 0 disables the reference model.")
    num_generations: int = Field(8, ge=2, description="Samples per prompt: the GRPO group size.")
    prompts_per_step: int = Field(8, ge=1)
    learning_rate: float = Field(2e-5, gt=0, le=1e-2)
    temperature: Temperature = Field(1.0, description="Sampling temperature of the rollouts.")
    max_completion_length: int = Field(48, ge=1)
    steps: int = Field(100, ge=1)
    seed: int = 0
    scale_rewards: Literal["group", "batch", "none"] = "group"
    eval_every: int = Field(0, ge=0, description="Evaluate on val every K steps (0: only at the end).")
    save_every: int = Field(
        25, ge=0, description="Checkpoint (TRL's own) every K steps; an interrupted run resumes from it (0: never)."
    )
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints a run keeps (the latest N).")
    rewards: dict[str, RewardWeight] = Field(
        default_factory=lambda: {"correctness": 1.0, "format": 0.1},
        description="Weight of each named reward component of the domain.",
    )
    group_filter: GroupFilterConfig = GroupFilterConfig()
    collapse_guard: CollapseGuardConfig = CollapseGuardConfig()

    @model_validator(mode="after")
    def _clip_range(self) -> RecipeConfig:
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            raise ValueError(f"epsilon_high ({self.epsilon_high}) must be >= epsilon ({self.epsilon})")
        return self

    @field_validator("rewards")
    @classmethod
    def _some_reward(cls, rewards: dict[str, float]) -> dict[str, float]:
        if not rewards:
            raise ValueError("name at least one reward component")
        if not any(rewards.values()):
            raise ValueError("give at least one component a weight > 0 (with all weights 0 every reward is 0)")
        return rewards

    @property
    def batch_size(self) -> int:
        """Completions per optimizer step."""
        return self.prompts_per_step * self.num_generations


class DataConfig(_Section):
    """Which train tasks a version trains on, beyond what the domain generates."""

    exclude_tasks: list[str] = Field(
        default_factory=list,
        description="Train task ids left out, e.g. hopeless prompts that no sample of the parent ever solved.",
    )
    exclude_subsets: list[str] = Field(
        default_factory=list,
        description="Train task subsets left out (a task's `subset`, e.g. math's 'ops4'): an easier training "
        "mix. Val is untouched, so versions stay comparable.",
    )


class EvalConfig(_Section):
    sampled_seeds: int = Field(2, ge=1, description="Sampled passes over val (greedy is always one pass).")
    temperature: Temperature = Field(1.0, description="Sampling temperature of the sampled passes.")
    max_completion_length: int | None = Field(
        None,
        ge=1,
        description="Tokens a completion (a multi-turn episode: model and environment tokens) may take in "
        "evaluation. Part of the evaluation protocol, not of the recipe: every version is evaluated with the same "
        "room, so a verdict compares policies, not budgets. Unset: the policy's whole room (its context minus the "
        "longest prompt), at most 1024.",
    )
    primary: Literal["sampled", "greedy"] = Field(
        "sampled",
        description="The pre-declared comparison a verdict decides on (per task, the mean over the sampled "
        "passes; or the greedy pass). The other is reported; it blocks only as a guardrail.",
    )
    guardrails: dict[Literal["sampled", "greedy"], float] = Field(
        default_factory=dict,
        description="Decodings besides the primary that block a promotion, each with a margin: "
        "{ greedy = 0.05 } makes a primary gain mixed when greedy's whole 95% interval lies below -0.05.",
    )

    @model_validator(mode="after")
    def _guardrails(self) -> EvalConfig:
        for decoding, margin in self.guardrails.items():
            if decoding == self.primary:
                raise ValueError(f"guardrails.{decoding}: the primary decides; a guardrail is another decoding")
            if not 0 <= margin < 1:
                raise ValueError(f"guardrails.{decoding} = {margin}: a margin is a share of tasks in [0, 1)")
        return self


class BudgetConfig(_Section):
    max_versions: int = Field(8, ge=1)
    max_train_steps: int = Field(2000, ge=1)


class GatesConfig(_Section):
    after_diagnosis: bool = False
    after_design: bool = True
    after_backtest: bool = False
    after_completion: bool = True


class CoachConfig(_Section):
    """The trainer agent: how many branches a round opens, its reasoning backend, when it escalates."""

    backend: Literal["offline", "anthropic"] = Field(
        "offline", description="'anthropic' needs ANTHROPIC_API_KEY in the environment; otherwise offline is used."
    )
    model: str = Field("claude-sonnet-4-5", description="Model name for the anthropic backend.")
    max_tokens: int = Field(4096, ge=256)
    branches: int = Field(2, ge=1, le=8, description="Versions proposed per round, each a different factor.")
    control: bool = Field(
        True,
        description="A round with room for two versions also runs a control: the parent trained on unchanged (once"
        " per parent, beside the round's factor branches); cases and skill cards credit the factors with their gain"
        " over it.",
    )
    harness: Literal["full", "score-only"] = Field(
        "full", description="'score-only' diagnoses with the score layer alone (an ablation)."
    )
    gates_after_failures: int = Field(2, ge=1, description="Consecutive failures after which gates switch on.")
    escalate_after: int = Field(3, ge=1, description="Consecutive failures after which the coach escalates.")


class BenchConfig(_Section):
    """`evotui bench`: the autonomy benchmark's arms on this workspace (docs/bench.md)."""

    budget_steps: int = Field(
        60, ge=1, description="GRPO steps each arm may train; the hand recipe trains one version of all of them."
    )
    version_steps: int = Field(20, ge=1, description="recipe.steps of the loops' versions (their budget is shared).")
    seeds: list[int] = Field([0, 1], min_length=1, description="recipe.seed of each repetition of the arms.")
    val_size: int | None = Field(None, ge=1, description="Val tasks of the benchmark's versions (unset: [domain]).")
    test_size: int | None = Field(
        None, ge=1, description="Test tasks the report scores every arm on (unset: [domain] test_size)."
    )
    leak_rate: float = Field(
        0.0, ge=0, le=1, description="SWE: the arms start with the leak switch on for this share of tasks (0: off)."
    )
    transfer_from: Literal["", "sample", "code"] = Field(
        "", description="Template whose one-round full loop runs first; its skills are offered to the full loop."
    )
    hand_recipe: dict[str, Any] = Field(
        default_factory=dict, description="[recipe] fields of the hand-made recipe, over this workspace's [recipe]."
    )
    lanes: int | None = Field(
        None,
        ge=1,
        description="Benchmark jobs run side by side, each run with cores // lanes torch threads"
        " (unset: one per core, at most 4; 1: one after the other, every run on all cores).",
    )
    quick_budget_steps: int = Field(8, ge=1, description="--quick: GRPO steps per arm.")
    quick_version_steps: int = Field(4, ge=1, description="--quick: recipe.steps of the loops' versions.")
    quick_warmup_steps: int = Field(200, ge=1, description="--quick: warm-up steps of v0.")
    quick_val_size: int = Field(32, ge=1, description="--quick: val tasks.")
    quick_test_size: int = Field(32, ge=1, description="--quick: test tasks.")

    @field_validator("hand_recipe")
    @classmethod
    def _recipe_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        RecipeConfig.model_validate({**value, "steps": 1})  # names the wrong field, as [recipe] would
        return value


class ComputeConfig(_Section):
    """`[compute]`: where runs execute (this machine, or a Ray cluster), on how many GPUs, and how
    GRPO generates (vLLM through TRL, with CUDA). Without CUDA, nothing here changes a run."""

    backend: Literal["local", "ray"] = Field(
        "local", description="local: one worker process per run here; ray: a round's branches as Ray tasks."
    )
    address: str | None = Field(
        None, description='backend = "ray": the cluster (e.g. "auto", "10.0.0.5:6379"; unset: a local one).'
    )
    cpus: int = Field(1, ge=1, description="CPUs a run asks for (Ray's num_cpus; torch threads of the worker).")
    gpus: int = Field(
        1, ge=0, description="GPUs per run; more than 1 launches the worker through `accelerate launch` (DDP)."
    )
    accelerate_config: Path | None = Field(
        None, strict=False, description="An accelerate config file (FSDP, DeepSpeed) passed to `accelerate launch`."
    )
    vllm: Literal["auto", "on", "off"] = Field(
        "auto", description="Generate with vLLM through TRL: auto uses it when CUDA and vllm are both present."
    )
    vllm_mode: Literal["colocate", "server"] = Field(
        "colocate", description="colocate: vLLM shares the training GPUs; server: a `trl vllm-serve` process."
    )
    vllm_server_host: str = "127.0.0.1"
    vllm_server_port: int = Field(8000, ge=1, le=65535)
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="colocate: vLLM's share of GPU memory.")
    max_retries: int = Field(1, ge=0, description="Times a run whose worker died is started again (it resumes).")

    @field_validator("accelerate_config")
    @classmethod
    def _relative_to_workspace(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        return _workspace_path(value, info)


class WorkspaceConfig(_Section):
    workspace: WorkspaceMeta
    domain: DomainConfig = MathDomainConfig()
    policy: PolicyConfig = PolicyConfig()
    # Validated also when [recipe] is left out: its default rewards must exist in the domain.
    recipe: RecipeConfig = Field(RecipeConfig(), validate_default=True)
    data: DataConfig = DataConfig()
    eval: EvalConfig = EvalConfig()
    budget: BudgetConfig = BudgetConfig()
    gates: GatesConfig = GatesConfig()
    coach: CoachConfig = CoachConfig()
    bench: BenchConfig = BenchConfig()
    tracking: TrackingConfig = TrackingConfig()
    compute: ComputeConfig = ComputeConfig()

    @field_validator("recipe")
    @classmethod
    def _reward_components_exist(cls, recipe: RecipeConfig, info: ValidationInfo) -> RecipeConfig:
        domain = info.data.get("domain")  # absent when [domain] itself is wrong (reported on its own)
        allowed = domain.REWARD_COMPONENTS if domain is not None else None
        if allowed is None:  # a custom domain: checked against its file when it is loaded
            return recipe
        unknown = sorted(set(recipe.rewards) - set(allowed))
        if unknown:
            raise ValueError(
                f"recipe.rewards names unknown component(s) {unknown} for domain "
                f"{domain.name!r}; allowed: {', '.join(allowed)}"
            )
        return recipe

    @model_validator(mode="after")
    def _policy_fits_domain(self) -> WorkspaceConfig:
        policy, domain = self.policy, self.domain
        if policy.chat_template and domain.name == "swe":
            raise ValueError(
                "policy.chat_template: the swe domain plays multi-turn episodes as plain text; "
                "set chat_template = false"
            )
        asked = "steps" in policy.warmup.model_fields_set
        if policy.pretrained is not None and asked and domain.name == "dataset" and domain.completion_field is None:
            raise ValueError(
                "policy.warmup.steps: a pretrained policy is warmed up on reference completions; set "
                "domain.completion_field, or remove [policy.warmup] steps to start from the model as it is"
            )
        return self

    @property
    def warmup_steps(self) -> int:
        """Supervised warm-up steps of v0: the embedded policy's always; a pretrained policy's only on a
        dataset with reference completions whose `[policy.warmup] steps` is written out (else 0: v0 is
        the model as it is)."""
        policy, domain = self.policy, self.domain
        if policy.pretrained is None:
            return policy.warmup.steps
        asked = "steps" in policy.warmup.model_fields_set
        return policy.warmup.steps if asked and getattr(domain, "completion_field", None) else 0


class WorkspaceConfigError(Exception):
    """`workspace.toml` could not be read or validated; `problems` has one line per error."""

    def __init__(self, path: Path, problems: list[str]):
        self.path = path
        self.problems = problems
        super().__init__("\n".join(problems))


def _line_of(text: str, loc: tuple[Any, ...]) -> int | None:
    """Best-effort line number of a dotted field in TOML text (tomllib keeps no positions)."""
    keys = [str(k) for k in loc if not isinstance(k, int)]
    if not keys:
        return None
    lines = text.splitlines()
    # Find the deepest table header that is a prefix of the field (or is the field: a section
    # refused as a whole), then the key below it.
    for depth in range(len(keys), -1, -1):
        table = keys[:depth]
        start = 0
        if table:
            header = re.compile(r"^\s*\[\s*" + r"\s*\.\s*".join(map(re.escape, table)) + r"\s*\]\s*(#.*)?$")
            found = [i for i, line in enumerate(lines) if header.match(line)]
            if not found:
                continue
            start = found[0] + 1
            if depth == len(keys):
                return start  # the table header line
        key_re = re.compile(r"^\s*" + re.escape(keys[depth]) + r"\s*=")
        for i in range(start, len(lines)):
            if lines[i].lstrip().startswith("["):
                break
            if key_re.match(lines[i]):
                return i + 1
        if table:
            return start  # the table header line
    return None


def _format_error(path: Path, text: str, err: dict[str, Any]) -> str:
    loc = tuple(err.get("loc", ()))
    if loc[:1] == ("domain",) and len(loc) > 1 and loc[1] in DOMAIN_SECTIONS:
        loc = loc[:1] + loc[2:]  # pydantic puts the union's tag in the path: domain.math.seed is domain.seed
    field = ".".join(str(k) for k in loc) or "(top level)"
    line = _line_of(text, loc)
    where = f"{path}:{line}" if line else str(path)
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown field (check the spelling; see sample_workspace/workspace.toml for every field)"
    elif err["type"] == "missing":
        msg = "required field is missing"
    elif msg.startswith("Value error, "):
        msg = msg.removeprefix("Value error, ")
    got = err.get("input")
    whole = isinstance(got, dict | BaseModel)  # a section refused as a whole: its repr says nothing
    suffix = f" (got {got!r})" if err["type"] not in ("missing", "model_type") and not whole else ""
    return f"{where}: field '{field}': {msg}{suffix}"


def parse_config(text: str, path: Path, root: Path | None = None) -> WorkspaceConfig:
    """Parse and validate TOML text; `path` names it in errors, `root` anchors relative paths."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise WorkspaceConfigError(path, [f"{path}: not valid TOML: {exc}"]) from None
    try:
        return WorkspaceConfig.model_validate(data, context={"root": root})
    except ValidationError as exc:
        problems = [_format_error(path, text, err) for err in exc.errors()]
        raise WorkspaceConfigError(path, problems) from None


def decode_config(raw: bytes, path: Path) -> str:
    """The text of `workspace.toml` bytes (TOML is UTF-8); `path` names them in the error."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise WorkspaceConfigError(
            path,
            [
                f"{path}:{line}: not UTF-8 text (byte {exc.start} is {raw[exc.start]:#04x}: {exc.reason}); "
                "save the file as UTF-8"
            ],
        ) from None


def read_config(path: Path) -> str:
    """The text of a `workspace.toml` file: the one reader of the file, so every caller gets the
    same errors (not found, unreadable, not UTF-8) as a WorkspaceConfigError naming it."""
    if not path.is_file():
        raise WorkspaceConfigError(path, [f"{path}: not found; create a workspace with `evotui init DIR`"])
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise WorkspaceConfigError(path, [f"{path}: cannot be read ({exc.strerror}); check its permissions"]) from None
    return decode_config(raw, path)


def load_config(workspace: Path) -> WorkspaceConfig:
    path = Path(workspace) / CONFIG_FILE
    return parse_config(read_config(path), path, root=Path(workspace))
