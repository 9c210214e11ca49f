"""Training data: a token stream written once to a ``.npy`` file and memory-mapped, cut
into windows, shuffled deterministically from a seed, with a held-out split and a
position to save in checkpoints; byte-level and BPE tokenizers for text::

    tokenizer = data.ByteTokenizer()                       # or data.bpe_tokenizer(path, 512, cache)
    tokens = data.cached_tokens(path, tokenizer, cache)    # np.memmap, written on first use
    train, val = data.split(tokens, seq=64, held_out=0.1)  # disjoint windows of seq + 1 tokens
    loader = data.Loader(train, batch=8, seed=0)
    inputs, targets = loader.next_batch()                  # [8, 64] int64 each
    loader.position                                        # samples drawn: save it, resume from it
"""

from tessera.data.text import ByteTokenizer, Tokenizer, bpe_tokenizer, cached_tokens
from tessera.data.tokens import Loader, Windows, open_tokens, split, write_tokens

__all__ = [
    "ByteTokenizer",
    "Loader",
    "Tokenizer",
    "Windows",
    "bpe_tokenizer",
    "cached_tokens",
    "open_tokens",
    "split",
    "write_tokens",
]
