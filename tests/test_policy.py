from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.config import EmbeddedPolicyConfig, MathDomainConfig, WarmupConfig
from engine.domains import make_domain
from engine.policy.pretrained import load_policy, save_policy
from engine.policy.tiny import build_tiny_policy, warmup_policy
from engine.runs.evaluate import generate

SMALL = EmbeddedPolicyConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


def test_tokenizer_round_trips_every_symbol_one_token_each() -> None:
    domain = make_domain(MathDomainConfig(train_size=10, val_size=5))
    _, tokenizer = build_tiny_policy(SMALL, domain)
    text = "Q:12+7-5\n12+7=19;19-5=14;A:14"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == text
    assert tokenizer.padding_side == "left"
    assert len({tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id}) == 3


def test_default_size_is_the_measured_tiny_policy() -> None:
    model, _ = build_tiny_policy(EmbeddedPolicyConfig(), make_domain(MathDomainConfig()))
    assert 0.5e6 < model.num_parameters() < 1.0e6
    assert model.config.tie_word_embeddings


def test_save_and_load_give_the_same_model(tmp_path: Path) -> None:
    model, tokenizer = build_tiny_policy(SMALL, make_domain(MathDomainConfig()), seed=3)
    save_policy(model, tokenizer, tmp_path / "m")
    loaded, loaded_tok = load_policy(tmp_path / "m")
    ids = torch.tensor([tokenizer("Q:1+2\n", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert loaded_tok.get_vocab() == tokenizer.get_vocab() and loaded_tok.padding_side == "left"


def test_warmup_lowers_the_loss_and_generation_reports_truncation() -> None:
    domain = make_domain(MathDomainConfig(train_size=100, val_size=10))
    model, tokenizer = build_tiny_policy(SMALL, domain)
    losses: list[float] = []
    warmup_policy(
        model, tokenizer, domain, WarmupConfig(steps=30, batch_size=16), on_step=lambda s, v: losses.append(v)
    )
    assert len(losses) == 30 and sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5
    prompts = [t.prompt for t in domain.tasks("val")]
    outputs = generate(model, tokenizer, prompts, max_new_tokens=2, do_sample=False)
    # Two tokens cannot hold a finished answer chain plus EOS unless EOS comes first.
    for text, truncated, length in outputs:
        assert length <= 2 and (truncated or length == len(text) + 1)


def test_a_warmup_batch_cut_by_length_has_the_whole_batchs_loss_and_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sorted pieces, each padded to its own longest row, weighted by their labelled tokens: the
    same loss and gradient as one batch padded to its longest row."""
    import random

    from engine.policy import tiny
    from engine.policy.pretrained import PromptFormat

    domain = make_domain(MathDomainConfig(train_size=64, val_size=8, test_size=8))
    model, tokenizer = build_tiny_policy(EmbeddedPolicyConfig(), domain, seed=0)
    rng = random.Random(0)
    tasks = domain.tasks("train")
    rows = [tiny._demo_rows(tasks[i], domain, tokenizer, rng, PromptFormat()) for i in range(48)]
    assert len({len(ids) for ids, _ in rows}) > 4, "rows of several lengths, or the cut changes nothing"
    pad = tokenizer.pad_token_id

    def loss_and_grads(pieces: int, min_tokens: int) -> tuple[float, list[torch.Tensor]]:
        monkeypatch.setattr(tiny, "MICRO_BATCHES", pieces)
        monkeypatch.setattr(tiny, "MIN_PIECE_TOKENS", min_tokens)
        model.zero_grad(set_to_none=True)
        loss = float(tiny._backward(model, rows, pad))
        return loss, [p.grad.clone() for p in model.parameters()]

    whole, whole_grads = loss_and_grads(1, 1)
    ids, attention, labels = tiny._batch(rows, pad)
    with torch.no_grad():
        reference = float(model(input_ids=ids, attention_mask=attention, labels=labels).loss)
    assert abs(whole - reference) < 1e-6
    cut, cut_grads = loss_and_grads(4, 1)
    assert abs(cut - whole) < 1e-5
    for a, b in zip(cut_grads, whole_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # Too few tokens for a piece: one batch, as before.
    monkeypatch.setattr(tiny, "MIN_PIECE_TOKENS", 10**9)
    pieces_seen = []
    real_batch = tiny._batch
    monkeypatch.setattr(tiny, "_batch", lambda r, p: pieces_seen.append(len(r)) or real_batch(r, p))
    tiny._backward(model, rows, pad)
    assert pieces_seen == [len(rows)]
