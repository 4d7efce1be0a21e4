"""Your model and your data: a Hugging Face policy with a chat template, with and without LoRA,
trained through the CLI on a JSONL dataset, and the pieces it is made of."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.core import Engine
from engine.domains import make_domain
from engine.domains.word_problems import word_problems, write_jsonl
from engine.policy.pretrained import ADAPTER_FILE, POINTER_FILE, PromptFormat, load_policy
from engine.policy.scratch import build_scratch_model
from engine.runs.worker import grpo_args, trackers
from engine.workspace import Workspace, init_workspace
from evotui.cli import app
from tests.conftest import commit_workspace_toml


def _set(text: str, section: str, key: str, value: str) -> str:
    """`key = value` in `[section]` of a TOML text (replaced, or added under the header)."""
    header = re.compile(rf"^\[{re.escape(section)}\][^\n]*\n", re.M)
    match = header.search(text)
    assert match, section
    end = text.find("\n[", match.end())
    body = text[match.end() : end if end >= 0 else len(text)]
    line = re.compile(rf"^{re.escape(key)}\s*=.*$", re.M)
    new_body = line.sub(f"{key} = {value}", body) if line.search(body) else f"{key} = {value}\n{body}"
    return text[: match.end()] + new_body + text[match.end() + len(body) :]


def dataset_workspace(root: Path, architecture: str, lora: bool, warmup: bool) -> Workspace:
    """The dataset template, pointed at a small JSONL split and a fresh model of `architecture`."""
    ws = init_workspace(root, "dataset")
    rows = word_problems(120, seed=11)
    for split, part in (("train", rows[:80]), ("val", rows[80:104]), ("test", rows[104:])):
        write_jsonl(ws.root / "mine" / f"{split}.jsonl", part)
    build_scratch_model(ws.root / "mymodel", [r["prompt"] + " " + r["solution"] for r in rows], architecture)
    text = ws.config_path.read_text()
    text = text.replace('file = "data/word_problems.jsonl"', 'train = "mine/train.jsonl"\nval = "mine/val.jsonl"')
    text = _set(text, "domain", "test", '"mine/test.jsonl"')
    for key in ("val_fraction", "test_fraction"):
        text = re.sub(rf"^{key} = .*\n", "", text, flags=re.M)
    text = _set(text, "policy", "name_or_path", '"mymodel"')
    if not lora:
        text = re.sub(r"\[policy\.lora\][^\[]*", "", text)
    if warmup:
        text = _set(text, "policy.warmup", "steps", "30")
        text = _set(text, "policy.warmup", "batch_size", "16")
    else:
        text = re.sub(r"\[policy\.warmup\][^\[]*", "", text)
    for key, value in (("steps", "2"), ("prompts_per_step", "2"), ("num_generations", "4")):
        text = _set(text, "recipe", key, value)
    text = _set(text, "eval", "sampled_seeds", "1")
    ws.config_path.write_text(text)
    commit_workspace_toml(ws, "small model and data for tests")
    return ws


@pytest.mark.slow
@pytest.mark.parametrize(
    ("architecture", "lora"), [("llama", False), ("qwen2", True)], ids=["llama-full", "qwen2-lora"]
)
def test_a_chat_model_trains_on_a_jsonl_dataset_through_the_cli(tmp_path: Path, architecture: str, lora: bool) -> None:
    # A short warm-up on the reference solutions, so that some groups have a reward spread to learn from.
    ws = dataset_workspace(tmp_path / "ws", architecture, lora, warmup=True)
    result = CliRunner().invoke(app, ["run", str(ws.root), "--auto-approve", "--versions", "1"])
    assert result.exit_code == 0, result.output
    with Engine.open(ws.root) as engine:
        config = engine.version_config("v1")
        recipe, domain = config.recipe, make_domain(config.domain, ws.root)
        run = engine.train_run("v1")
        assert run is not None and run.state == "succeeded"
        store = engine.store
        assert store.count_rollouts(run.id, "train") == recipe.steps * recipe.batch_size
        assert len(store.metric_series(run.id, "reward")) == recipe.steps
        # The stored prompt is the task's text; the model saw it through the chat template.
        prompts = {t.task_id: t.prompt for t in domain.tasks("train")}
        rows = store.query("SELECT task_id, prompt FROM rollouts WHERE run_id = ? AND split = 'train'", [run.id])
        assert rows and all(prompt == prompts[task] for task, prompt in rows)
        val = store.query("SELECT count(DISTINCT task_id) FROM rollouts WHERE run_id = ? AND split = 'val'", [run.id])
        assert val == [(len(domain.tasks("val")),)]
        v0, v1 = store.get_version("v0"), store.get_version("v1")
        assert v0 is not None and v1 is not None
        # The verdict was computed from both versions' val scores.
        assert v1.state in ("promoted", "rejected", "pruned") and v1.val_n == len(domain.tasks("val"))
    v0_dir, v1_dir = ws.root / (v0.checkpoint or ""), ws.root / (v1.checkpoint or "")
    # v0 was warmed up (asked for, with reference completions): a whole model, not a pointer.
    assert (v0_dir / "model.safetensors").is_file() and not (v0_dir / POINTER_FILE).exists()
    # v1: an adapter with LoRA (no whole model), a whole model without.
    assert (v1_dir / ADAPTER_FILE).is_file() == lora
    assert (v1_dir / "adapter_model.safetensors").is_file() == lora
    assert (v1_dir / "model.safetensors").is_file() != lora
    if lora:
        base = json.loads((v1_dir / ADAPTER_FILE).read_text())["base_model_name_or_path"]
        assert Path(base) == v0_dir  # the warmed-up v0 is the adapter's base
    model, _ = load_policy(v1_dir)
    from peft import PeftModel

    assert isinstance(model, PeftModel) == lora
    # The adapter changed the policy: its LoRA B matrices (zero at the start) moved.
    if lora:
        moved = [p.abs().max().item() for n, p in model.named_parameters() if "lora_B" in n]
        assert moved and max(moved) > 0


def test_prompts_are_encoded_through_the_chat_template_with_the_system_prompt(tmp_path: Path) -> None:
    model_dir = build_scratch_model(tmp_path / "m", ["Ana has 3 apples.", "Answer: 3"], "qwen2", vocab_size=300)
    _, tokenizer = load_policy(model_dir)
    chat, plain = PromptFormat(chat=True, system="Be brief."), PromptFormat()
    (ids,) = chat.encode(tokenizer, ["Ana has 3 apples."])
    text = tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert text.endswith("<|im_start|>user\nAna has 3 apples.<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.decode(plain.encode(tokenizer, ["Ana has 3 apples."])[0]) == "Ana has 3 apples."
    assert chat.dataset_prompt("x") == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x"}]
    assert PromptFormat.completion_text([{"role": "assistant", "content": "Answer: 3"}]) == "Answer: 3"


def test_trackers_reach_trl_named_by_the_run_and_unknown_or_missing_ones_are_refused(tmp_path: Path) -> None:
    from engine.config import RecipeConfig

    args = grpo_args(RecipeConfig(steps=1), tmp_path, [1.0], report_to=["tensorboard"], run_name="v3-train-1")
    assert args.report_to == ["tensorboard"] and args.run_name == "v3-train-1"
    assert grpo_args(RecipeConfig(steps=1), tmp_path, [1.0]).report_to == []  # "none"
    with pytest.raises(ValueError, match="unknown tracker.*tensorbord"):
        trackers(["tensorbord"])
    from transformers.integrations import get_available_reporting_integrations

    absent = next(
        n for n in ("trackio", "wandb", "tensorboard", "mlflow") if n not in get_available_reporting_integrations()
    )
    with pytest.raises(ValueError, match=f"{absent}.*not installed"):
        trackers([absent])


def test_init_from_dataset_builds_a_model_and_ships_the_data(tmp_path: Path) -> None:
    ws = init_workspace(tmp_path / "ws", "dataset")
    config = ws.load_config()
    assert config.policy.kind == "hf" and config.policy.chat_template and config.policy.lora is not None
    model, tokenizer = load_policy(Path(config.policy.name_or_path or ""))
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    domain = make_domain(config.domain, ws.root)
    sizes = {split: len(domain.tasks(split)) for split in ("train", "val", "test")}
    assert sum(sizes.values()) == len((ws.root / "data" / "word_problems.jsonl").read_text().splitlines())
    assert config.warmup_steps == config.policy.warmup.steps > 0  # asked for, with reference completions
    assert "model/" in (ws.root / ".gitignore").read_text().splitlines()


def test_the_shipped_word_problems_are_the_generators_and_a_pretrained_math_policy_is_not_warmed_up() -> None:
    from engine.config import parse_config
    from engine.domains.word_problems import SAMPLE_ROWS, SAMPLE_SEED

    shipped = Path(__file__).parents[1] / "sample_workspace" / "variants" / "dataset" / "word_problems.jsonl"
    assert [json.loads(line) for line in shipped.read_text().splitlines()] == word_problems(SAMPLE_ROWS, SAMPLE_SEED)
    text = '[workspace]\nname = "m"\n[policy]\nkind = "hf"\nname_or_path = "org/model"\n[policy.warmup]\nsteps = 50\n'
    # The math domain has demonstrations, but no reference completions of the user's: v0 is the model.
    assert parse_config(text, Path("w.toml")).warmup_steps == 0
    assert parse_config('[workspace]\nname = "m"\n', Path("w.toml")).warmup_steps == 300  # embedded
