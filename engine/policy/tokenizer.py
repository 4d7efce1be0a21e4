"""A character-level tokenizer built in code: no download, and every symbol of a domain is a token."""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"


def build_char_tokenizer(alphabet: str) -> PreTrainedTokenizerFast:
    symbols = sorted(set(alphabet))
    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS, UNK, *symbols])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # `.` does not match a newline in the tokenizers regex engine; `[\s\S]` does.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return wrap(core)


def wrap(core: Tokenizer) -> PreTrainedTokenizerFast:
    """A `tokenizers` tokenizer as a transformers one with the special tokens every embedded
    policy uses, padded on the left (generation), decoded exactly as written."""
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
