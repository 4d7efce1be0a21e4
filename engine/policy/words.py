"""A word-level tokenizer built in code (no download) for multi-turn tool domains.

A character-level tokenizer makes tool episodes 2.4x longer, too long for a tiny policy to learn
from on a CPU; whole words (identifiers, file names, numbers, operators) with the leading space
glued on keep an episode under ~240 tokens. A piece that is not a word of the domain (an
identifier the policy made up, a number out of range) falls back to its characters, so every
ASCII text round-trips exactly: `decode(encode(x)) == x`.

The fallback is a BPE model without merges and with `ignore_merges`: a pre-token found in the
vocabulary is one token; any other is split into its characters, which are all in the vocabulary.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from engine.domains.base import PRINTABLE
from engine.policy.tokenizer import BOS, EOS, PAD, UNK, wrap

# One pre-token each: a newline (its own token: the rollout loop stops generation at it); an
# identifier or file name; a number with its sign; a two-character operator; one other symbol;
# each but the newline with an optional leading space. `[\s\S]` catches what is left (a second
# space, a tab), because `.` does not match a newline in the tokenizers regex engine.
PIECE = r"\n| ?[A-Za-z_][A-Za-z0-9_]*(?:\.py)?| ?-?[0-9]+| ?(?:==|=>|//|!=|<=|>=|\*\*)| ?[^\sA-Za-z0-9_]|[\s\S]"

#: The character fallback: every printable ASCII character and the whitespace an edit can carry.
FALLBACK = PRINTABLE


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Split(Regex(PIECE), behavior="isolated")


def build_word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """A tokenizer whose tokens are the special tokens, the characters of `FALLBACK`, and every
    word both bare and with a leading space (a word follows either a space or a symbol).

    Each word must be a single pre-token (`PIECE`), otherwise it could never be matched: such a
    word is a mistake in the domain's vocabulary and raises a ValueError that names it.
    """
    split = _pre_tokenizer()
    unmatchable = [w for w in words if [p for p, _ in split.pre_tokenize_str(w)] != [w] or w.startswith(" ")]
    if unmatchable:
        raise ValueError(
            f"vocabulary words that are not a single piece of {PIECE!r} (without a leading space): "
            f"{unmatchable[:10]!r}; split them into separate words"
        )
    entries: dict[str, None] = dict.fromkeys([PAD, BOS, EOS, UNK, *FALLBACK])
    for word in words:
        entries[word] = None
        if word != "\n":
            entries[" " + word] = None
    vocab = {token: i for i, token in enumerate(entries)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK, ignore_merges=True))
    core.pre_tokenizer = split
    core.decoder = decoders.Fuse()
    return wrap(core)
