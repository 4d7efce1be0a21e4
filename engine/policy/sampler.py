"""Sampling from small Llama-architecture policies at the speed of the hardware.

HF `generate` costs ~6 ms a token step on the 0.66M-parameter math policy at batch 64, where the
arithmetic needs ~1 ms: the rest is per-token Python and per-op overhead (cache objects, mask
building, logits processors, stopping criteria). This module runs the same computation with a
preallocated KV cache and one short loop of tensor ops a step:

- weights are read from the model's parameters at each call (GRPO updates them between calls);
  q/k/v and gate/up are concatenated once a call, so a layer is five matmuls;
- RMSNorm with the model's eps, RoPE from the model's own `rotary_emb` (a table built once a
  call, so rope scaling types stay exactly as transformers computes them), position ids as HF
  computes them for a left-padded batch, `scaled_dot_product_attention` over the cache;
- plain decoding only: greedy, or temperature then multinomial (top_k 0, top_p 1), which is what
  the project uses; anything else goes to HF `generate` (`supports`).

A `Session` is a batch of token streams that share one cache and grow by ragged appends: each row
can take a different number of tokens (a multi-turn episode's observations) and decode on, so an
episode's context is encoded once, not once a turn. Each row keeps its own position counter and a
key-validity mask; the shared column axis may hold holes (padding of a ragged append, steps after
a row stopped), which the mask hides and `Session` squeezes out when they grow.

`RecomputeSession` is the same interface over HF `generate` that re-encodes each row's whole
context every call: the fallback for models this sampler does not support.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

#: Rows sampled together at most: a bigger batch is cut into chunks of this many, which bounds the
#: cache (rows x columns x layers x 2 x hidden floats).
MAX_ROWS = 256

#: The most bytes one chunk's KV cache may take (a pretrained model's evaluation budget can be
#: 1,024 tokens): `generate_ids` cuts a batch into fewer rows a chunk to stay under it.
MAX_CACHE_BYTES = 2 * 1024**3

#: RoPE types whose tables do not depend on the sequence length ("dynamic" and "longrope" rescale
#: with it, and are refused).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")

#: Generation-config fields that add a logits processor, a stopping rule or another decoding
#: strategy, with the values at which they do nothing. A model whose generation config sets any
#: of them otherwise is sampled by HF `generate`, which applies them.
NEUTRAL_GENERATION: dict[str, tuple[Any, ...]] = {
    "num_beams": (None, 1),
    "num_beam_groups": (None, 1),
    "num_return_sequences": (None, 1),
    "penalty_alpha": (None,),
    "dola_layers": (None,),
    "prompt_lookup_num_tokens": (None,),
    "guidance_scale": (None, 1, 1.0),
    "repetition_penalty": (None, 1, 1.0),
    "encoder_repetition_penalty": (None, 1, 1.0),
    "no_repeat_ngram_size": (None, 0),
    "encoder_no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,),
    "force_words_ids": (None,),
    "constraints": (None,),
    "sequence_bias": (None,),
    "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "min_length": (None, 0),
    "min_new_tokens": (None, 0),
    "exponential_decay_length_penalty": (None,),
    "typical_p": (None, 1, 1.0),
    "epsilon_cutoff": (None, 0, 0.0),
    "eta_cutoff": (None, 0, 0.0),
    "min_p": (None,),
    "top_h": (None,),
    "watermarking_config": (None,),
    "stop_strings": (None,),
    "max_time": (None,),
    "token_healing": (None, False),
}


def neutral_generation(config: Any) -> bool:
    """Whether a `GenerationConfig` leaves decoding plain (see NEUTRAL_GENERATION); temperature,
    top_k and top_p are the caller's, checked where they are set."""
    return all(getattr(config, name, None) in values for name, values in NEUTRAL_GENERATION.items())


def plain_sampling(config: Any, model_config: Any = None) -> bool:
    """Whether a `GenerationConfig` asks for plain sampling: temperature then one multinomial draw
    (top_k 0, top_p 1, nothing in NEUTRAL_GENERATION). A field left None takes the model's
    generation config's value, else HF's default, as `generate` resolves it (top_k None is 50)."""

    def value(name: str, default: Any) -> Any:
        for source in (config, model_config):
            if source is not None and getattr(source, name, None) is not None:
                return getattr(source, name)
        return default

    temperature = value("temperature", 1.0)
    return (
        bool(value("do_sample", False))
        and temperature > 0
        and value("top_k", 50) == 0
        and value("top_p", 1.0) == 1.0
        and neutral_generation(config)
        and (model_config is None or neutral_generation(model_config))
    )


def hf_sampling(do_sample: bool, temperature: float) -> dict[str, Any]:
    """HF `generate` keyword arguments of plain decoding: greedy, or temperature alone."""
    if do_sample:
        return {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    return {"do_sample": False}


def supports(model: Any) -> bool:
    """Whether `model` is a plain `LlamaForCausalLM` in float32 on CPU or CUDA that this sampler
    computes exactly: no peft wrapper or injected adapter layers, no quantization or offloading
    hooks, multi-head attention without biases, SiLU MLP, a static RoPE type, and a generation
    config without extra logits processors."""
    from transformers import LlamaForCausalLM
    from transformers.activations import SiLUActivation
    from transformers.models.llama.modeling_llama import (
        LlamaDecoderLayer,
        LlamaRMSNorm,
        LlamaRotaryEmbedding,
    )

    if type(model) is not LlamaForCausalLM:  # a subclass or a peft wrapper may compute otherwise
        return False
    config = model.config
    inner = model.model
    if (
        config.model_type != "llama"
        or config.num_key_value_heads != config.num_attention_heads
        or config.hidden_act != "silu"
        or config.attention_bias
        or config.mlp_bias
        or getattr(config, "pretraining_tp", 1) not in (None, 1)
        or (model.training and config.attention_dropout)
        or model.device.type not in ("cpu", "cuda")
        or any(p.dtype != torch.float32 for p in model.parameters())
        or any(hasattr(m, "_hf_hook") for m in model.modules())  # accelerate offloading
        or not neutral_generation(model.generation_config)
    ):
        return False
    if (
        type(inner.rotary_emb) is not LlamaRotaryEmbedding
        or inner.rotary_emb.rope_type not in STATIC_ROPE_TYPES
        or type(inner.embed_tokens) is not nn.Embedding
        or type(inner.norm) is not LlamaRMSNorm
        or type(model.lm_head) is not nn.Linear
        or model.lm_head.bias is not None
        or len(inner.layers) != config.num_hidden_layers
    ):
        return False
    for layer in inner.layers:
        attn, mlp = layer.self_attn, layer.mlp
        linears = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if (
            type(layer) is not LlamaDecoderLayer
            or any(type(m) is not nn.Linear or m.bias is not None for m in linears)  # peft injects lora.Linear
            or type(layer.input_layernorm) is not LlamaRMSNorm
            or type(layer.post_attention_layernorm) is not LlamaRMSNorm
            or not isinstance(mlp.act_fn, SiLUActivation | nn.SiLU)
        ):
            return False
    return True


@dataclass(frozen=True)
class _Layer:
    norm_in: torch.Tensor
    eps_in: float
    qkv: torch.Tensor  # q, k and v projections stacked: one matmul
    out: torch.Tensor
    norm_post: torch.Tensor
    eps_post: float
    gate_up: torch.Tensor  # gate and up projections stacked
    down: torch.Tensor


class _Network:
    """A supported model's weights as plain tensors, read at call time, and its RoPE table."""

    def __init__(self, model: Any):
        inner = model.model
        attn = inner.layers[0].self_attn
        self.model = model
        self.device = inner.embed_tokens.weight.device
        self.heads = model.config.num_attention_heads
        self.head_dim = attn.head_dim
        self.scale = attn.scaling
        self.hidden = model.config.hidden_size
        self.embed = inner.embed_tokens.weight.detach()
        self.norm = inner.norm.weight.detach()
        self.eps = inner.norm.variance_epsilon
        self.lm_head = model.lm_head.weight.detach()
        self.layers = [
            _Layer(
                norm_in=layer.input_layernorm.weight.detach(),
                eps_in=layer.input_layernorm.variance_epsilon,
                qkv=torch.cat(
                    [layer.self_attn.q_proj.weight, layer.self_attn.k_proj.weight, layer.self_attn.v_proj.weight]
                ),
                out=layer.self_attn.o_proj.weight.detach(),
                norm_post=layer.post_attention_layernorm.weight.detach(),
                eps_post=layer.post_attention_layernorm.variance_epsilon,
                gate_up=torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]),
                down=layer.mlp.down_proj.weight.detach(),
            )
            for layer in inner.layers
        ]
        self.rope = torch.empty(0)
        self.rope_table(model.config.max_position_embeddings)

    def rope_table(self, positions: int) -> None:
        """cos and sign-folded sin of positions [0, positions), from the model's own rotary
        embedding: `rotate_half(x) * sin == swap_halves(x) * signed_sin`, element for element."""
        if len(self.rope) >= positions:
            return
        ids = torch.arange(positions, device=self.device)[None]
        cos, sin = self.model.model.rotary_emb(self.embed[:1], position_ids=ids)
        half = self.head_dim // 2
        # [position, cos | signed sin]: one lookup a step gives both.
        self.rope = torch.cat([cos[0], -sin[0, :, :half], sin[0, :, half:]], dim=-1)


class Decoder(Protocol):
    """A batch of token streams that decode together and grow by ragged appends."""

    def append(self, tokens: Sequence[Sequence[int]]) -> None: ...

    def keep(self, rows: Sequence[int]) -> None: ...

    def decode(
        self, max_new_tokens: int, stop_ids: Sequence[int], do_sample: bool, temperature: float = 1.0
    ) -> list[list[int]]: ...


def _cut(row: list[int], stops: Sequence[int]) -> list[int]:
    """A row of new tokens up to and including its first stop token."""
    return next((row[: k + 1] for k, t in enumerate(row) if t in stops), row)


class Session:
    """Rows of token streams over one KV cache of layout [layer, k/v, row, head, column, dim].

    Every row's context is its cached tokens plus its pending ones (appended or last sampled, not
    yet run through the model); `decode` runs the pending tokens as one left-padded chunk, then
    samples a token a step. A row that emitted a stop token feeds pad at a masked column and its
    position does not advance; its stop token stays pending, so the next `decode` (after an
    `append`) continues from it. Every row always has at least one pending token. `bias` is the
    additive key mask (0 for a token of the row's context, -inf for a hole)."""

    def __init__(self, net: _Network, prompt_ids: Sequence[Sequence[int]], pad_id: int, capacity: int = 0):
        if not prompt_ids or not all(prompt_ids):
            raise ValueError("a session needs at least one row, and every row a non-empty prompt")
        self.net = net
        self.pad_id = pad_id
        self.pending = [list(row) for row in prompt_ids]
        rows = len(prompt_ids)
        self.length = 0  # columns in use
        self.bias = torch.zeros(rows, 0, device=net.device)
        self.pos = torch.zeros(rows, dtype=torch.long, device=net.device)
        self.kv = self._empty(rows, 0)
        self._reserve(capacity or max(map(len, prompt_ids)))

    @classmethod
    def of(cls, model: Any, prompt_ids: Sequence[Sequence[int]], pad_id: int, capacity: int = 0) -> Session:
        with torch.inference_mode():
            return cls(_Network(model), prompt_ids, pad_id, capacity)

    @property
    def rows(self) -> int:
        return len(self.pending)

    def append(self, tokens: Sequence[Sequence[int]]) -> None:
        """Add `tokens[i]` (any number, none included) to row i's context."""
        if len(tokens) != self.rows:
            raise ValueError(f"append got {len(tokens)} rows of tokens for a session of {self.rows}")
        for pending, more in zip(self.pending, tokens, strict=True):
            pending += more

    @torch.inference_mode()
    def keep(self, rows: Sequence[int]) -> None:
        """Keep only these rows, in this order (finished episodes leave the batch)."""
        if list(rows) == list(range(self.rows)):
            return
        if not rows:
            raise ValueError("a session cannot keep zero rows")
        index = torch.tensor(rows, device=self.net.device)
        self.kv = self.kv[:, :, index]
        self.bias = self.bias[index]
        self.pos = self.pos[index]
        self.pending = [self.pending[i] for i in rows]

    @torch.inference_mode()
    def decode(
        self, max_new_tokens: int, stop_ids: Sequence[int], do_sample: bool, temperature: float = 1.0
    ) -> list[list[int]]:
        """Each row's new tokens, up to and including its first stop token; the batch stops when
        every row has stopped or after `max_new_tokens` steps."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        net, pad = self.net, self.pad_id
        device = net.device
        counts = [len(p) for p in self.pending]
        assert min(counts) > 0, "every row keeps a pending token"
        width = max(counts)
        self._compact()
        self._reserve(width + max_new_tokens - 1)
        net.rope_table(int(self.pos.max()) + width + max_new_tokens)

        # The pending chunk, left-padded, at columns [start, start + width).
        start = self.length
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in self.pending], device=device)
        lead = width - torch.tensor(counts, device=device)
        steps = torch.arange(width, device=device)
        self.bias[:, start : start + width] = _masked(steps[None] < lead[:, None])
        # HF's position ids of a left-padded row: the mask's cumsum - 1 (padding clamped to 0).
        positions = (self.pos[:, None] + steps[None] - lead[:, None]).clamp_(min=0)
        keys = torch.arange(start + width, device=device)
        queries = start + steps
        # A padding query sees its own column too, so that no query row is empty (an empty row
        # turns into NaN keys for later layers); valid queries never see padding.
        bias = (self.bias[:, None, : start + width] + _masked(keys[None] > queries[:, None])[None]).masked_fill_(
            (keys[None] == queries[:, None])[None], 0.0
        )
        logits = self._forward(ids, positions, bias, start)
        self.length = start + width
        self.pos += torch.tensor(counts, device=device)

        stops = torch.tensor(list(stop_ids), device=device)
        out = torch.full((self.rows, max_new_tokens), pad, device=device)
        token = _pick(logits, do_sample, temperature)
        out[:, 0] = token
        done = torch.isin(token, stops)
        ran = 1
        for step in range(1, max_new_tokens):
            if bool(done.all()):
                break
            col = self.length
            live = ~done  # rows whose last token enters the cache now
            self.bias[:, col].masked_fill_(done, float("-inf"))  # columns past `length` hold 0
            logits = self._forward(
                torch.where(live, token, pad)[:, None],
                self.pos[:, None],
                self.bias[:, None, : col + 1],
                col,
            )
            self.length = col + 1
            self.pos += live
            token = torch.where(live, _pick(logits, do_sample, temperature), pad)
            out[:, step] = token
            done |= torch.isin(token, stops)
            ran = step + 1
        rows = [_cut(row, stop_ids) for row in out[:, :ran].tolist()]
        self.pending = [[row[-1]] for row in rows]
        return rows

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor, start: int) -> torch.Tensor:
        """Run tokens `ids` [rows, width] at cache columns [start, start + width) with the additive
        attention mask `bias` [rows, width, columns]: writes their keys and values, returns the
        logits of the last column. Activations are 2-D [rows * width, hidden]: fewer, larger ops."""
        net = self.net
        rows, width = ids.shape
        n, end = rows * width, start + width
        heads, dim, hidden = net.heads, net.head_dim, net.hidden
        half, shape = dim // 2, (hidden,)
        x = F.embedding(ids.view(n), net.embed)
        rope = F.embedding(positions.reshape(n), net.rope)[:, None]  # broadcast over q and k heads
        cos, sin = rope[..., :dim], rope[..., dim:]
        for layer, (keys, values) in zip(net.layers, self.kv, strict=True):
            h = F.rms_norm(x, shape, layer.norm_in, layer.eps_in)
            qkv = F.linear(h, layer.qkv)  # [n, q | k | v]
            qk = qkv[:, : 2 * hidden].view(n, 2 * heads, dim)
            # RoPE in place, in HF's order of operations: q * cos + rotate_half(q) * sin.
            turned = torch.cat([qk[..., half:], qk[..., :half]], dim=-1).mul_(sin)
            qk.mul_(cos).add_(turned)
            q, k, v = qkv.view(rows, width, 3, heads, dim).unbind(2)
            keys[:, :, start:end] = k.transpose(1, 2)
            values[:, :, start:end] = v.transpose(1, 2)
            # Each (row, head) block of the cache is a contiguous [columns, dim] matrix, the
            # layout `scaled_dot_product_attention` runs fastest on (as HF's cache has it).
            attn = F.scaled_dot_product_attention(
                q.transpose(1, 2), keys[:, :, :end], values[:, :, :end], attn_mask=bias[:, None], scale=net.scale
            )
            x = x + F.linear(attn.transpose(1, 2).reshape(n, hidden), layer.out)
            h = F.rms_norm(x, shape, layer.norm_post, layer.eps_post)
            gate, up = F.linear(h, layer.gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down)
        last = x.view(rows, width, hidden)[:, -1]
        return F.linear(F.rms_norm(last, shape, net.norm, net.eps), net.lm_head)

    def _empty(self, rows: int, columns: int) -> torch.Tensor:
        net = self.net
        shape = (len(net.layers), 2, rows, net.heads, columns, net.head_dim)
        # Never read before written: every column below `length` holds finite keys and values.
        return torch.empty(shape, dtype=torch.float32, device=net.device)

    def _reserve(self, columns: int) -> None:
        """Room for `columns` more columns (grown by half again at least, so that a long session
        reallocates rarely)."""
        need = self.length + columns
        capacity = self.bias.shape[1]
        if need <= capacity:
            return
        capacity = max(need, capacity + capacity // 2)
        kv = self._empty(self.rows, capacity)
        kv[..., : self.length, :] = self.kv[..., : self.length, :]
        bias = torch.zeros(self.rows, capacity, device=self.net.device)
        bias[:, : self.length] = self.bias[:, : self.length]
        self.kv, self.bias = kv, bias

    def _compact(self) -> None:
        """Squeeze out the holes once they are a quarter of the columns: every row's context
        columns move left, in order (attention reads only the mask; positions live in the keys)."""
        if self.length == 0:
            return
        hole = self.bias[:, : self.length] != 0
        keep = self.length - int(hole.sum(1).min())
        if self.length - keep <= self.length // 4:
            return
        order = torch.sort(hole.to(torch.uint8), dim=1, stable=True).indices[:, :keep]
        rows = torch.arange(self.rows, device=self.net.device)[:, None]
        kv = self._empty(self.rows, self.bias.shape[1])
        kv[..., :keep, :] = self.kv[:, :, rows, :, order].permute(2, 3, 0, 4, 1, 5)
        bias = torch.zeros_like(self.bias)
        bias[:, :keep] = self.bias.gather(1, order)
        self.kv, self.bias, self.length = kv, bias, keep


def _masked(hidden: torch.Tensor) -> torch.Tensor:
    """An additive attention mask: -inf where `hidden`, else 0."""
    return torch.zeros(hidden.shape, device=hidden.device).masked_fill_(hidden, float("-inf"))


def _pick(logits: torch.Tensor, do_sample: bool, temperature: float) -> torch.Tensor:
    """HF's plain decoding: argmax, or softmax(logits / temperature) then one multinomial draw."""
    if not do_sample:
        return logits.argmax(-1)
    probs = F.softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)  # HF skips 1.0 too
    return torch.multinomial(probs, num_samples=1).squeeze(1)


class RecomputeSession:
    """The `Session` interface over HF `generate`: each `decode` re-encodes every row's whole
    context (left-padded), as the project did before this sampler. For unsupported models."""

    def __init__(self, model: Any, prompt_ids: Sequence[Sequence[int]], pad_id: int):
        self.model = model
        self.pad_id = pad_id
        self.contexts = [list(row) for row in prompt_ids]

    def append(self, tokens: Sequence[Sequence[int]]) -> None:
        for context, more in zip(self.contexts, tokens, strict=True):
            context += more

    def keep(self, rows: Sequence[int]) -> None:
        self.contexts = [self.contexts[i] for i in rows]

    def decode(
        self, max_new_tokens: int, stop_ids: Sequence[int], do_sample: bool, temperature: float = 1.0
    ) -> list[list[int]]:
        rows = hf_generate_ids(self.model, self.contexts, max_new_tokens, stop_ids, self.pad_id, do_sample, temperature)
        for context, row in zip(self.contexts, rows, strict=True):
            context += row
        return rows


def open_session(model: Any, prompt_ids: Sequence[Sequence[int]], pad_id: int, capacity: int = 0) -> Decoder:
    """A `Session` for a supported model, else a `RecomputeSession`."""
    if supports(model):
        return Session.of(model, prompt_ids, pad_id, capacity)
    return RecomputeSession(model, prompt_ids, pad_id)


@torch.no_grad()
def hf_generate_ids(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    pad_id: int,
    do_sample: bool,
    temperature: float = 1.0,
) -> list[list[int]]:
    """HF `generate` over left-padded rows (one batch), each row cut after its first stop token."""
    width = max(len(row) for row in prompt_ids)
    input_ids = torch.tensor([[pad_id] * (width - len(row)) + list(row) for row in prompt_ids], device=model.device)
    attention = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in prompt_ids], device=model.device)
    generated = model.generate(
        input_ids=input_ids,
        attention_mask=attention,
        max_new_tokens=max_new_tokens,
        eos_token_id=list(stop_ids),
        pad_token_id=pad_id,
        **hf_sampling(do_sample, temperature),
    )
    return [_cut(row, stop_ids) for row in generated[:, width:].tolist()]


def generate_ids(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    max_new_tokens: int,
    stop_ids: Sequence[int],
    pad_id: int,
    do_sample: bool,
    temperature: float = 1.0,
    batch_size: int = MAX_ROWS,
) -> list[list[int]]:
    """Each prompt's new tokens, cut after (and including) its first stop token, in chunks of
    `batch_size` rows (fewer where a chunk's cache would pass MAX_CACHE_BYTES): this sampler for a
    supported model, else HF `generate` (left-padded, `top_k=0, top_p=1.0`)."""
    stops = list(stop_ids)
    fast = supports(model) and all(prompt_ids)
    if fast:
        config = model.config
        longest = max((len(row) for row in prompt_ids), default=0)
        row_bytes = 2 * config.num_hidden_layers * config.hidden_size * 4 * (longest + max_new_tokens)
        batch_size = max(1, min(batch_size, MAX_CACHE_BYTES // row_bytes))
    chunks = [prompt_ids[i : i + batch_size] for i in range(0, len(prompt_ids), batch_size)]
    if not fast:
        return [
            row
            for c in chunks
            for row in hf_generate_ids(model, c, max_new_tokens, stops, pad_id, do_sample, temperature)
        ]
    out: list[list[int]] = []
    with torch.inference_mode():
        net = _Network(model)
        for chunk in chunks:
            capacity = max(map(len, chunk)) + max_new_tokens - 1
            out += Session(net, chunk, pad_id, capacity).decode(max_new_tokens, stops, do_sample, temperature)
    return out


__all__ = [
    "MAX_CACHE_BYTES",
    "MAX_ROWS",
    "Decoder",
    "RecomputeSession",
    "Session",
    "generate_ids",
    "hf_generate_ids",
    "hf_sampling",
    "neutral_generation",
    "open_session",
    "plain_sampling",
    "supports",
]
