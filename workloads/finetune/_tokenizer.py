"""A word-level tokenizer built offline from a corpus, wrapped as a transformers fast tokenizer.

The LoRA default must need nothing from the network, so it cannot download Qwen2's tokenizer. This
one splits text into words, single digits and punctuation runs (whitespace is dropped: decoding
joins tokens with spaces) and numbers the distinct pieces of the corpus in sorted order, so every
rank and host that builds it from the same corpus gets the same ids.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, UNK, EOS = "<pad>", "<unk>", "<|endoftext|>"
SPECIAL = (PAD, UNK, EOS)


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)])


def build_tokenizer(texts: Iterable[str], max_vocab: int | None = None) -> PreTrainedTokenizerFast:
    """A tokenizer whose vocabulary is the pieces of ``texts`` (the most frequent ``max_vocab``).

    Ids are deterministic: special tokens first, then pieces by descending count, ties by string.
    Pieces never seen map to ``<unk>``.
    """
    pre = _pre_tokenizer()
    counts: dict[str, int] = {}
    for text in texts:
        for part in text.split(EOS):
            for piece, _ in pre.pre_tokenize_str(part):
                counts[piece] = counts.get(piece, 0) + 1
    pieces = sorted(counts, key=lambda p: (-counts[p], p))
    if max_vocab is not None:
        pieces = pieces[: max(0, max_vocab - len(SPECIAL))]
    vocab = {tok: i for i, tok in enumerate((*SPECIAL, *(p for p in pieces if p not in SPECIAL)))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre
    core.add_special_tokens(list(SPECIAL))
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, unk_token=UNK, eos_token=EOS)
