"""Tokenizers for text (bytes, or a byte-level BPE trained on the file with Hugging
Face ``tokenizers``, cached as JSON) and the token stream of a file, written once to a
cache directory."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from tessera.data.tokens import open_tokens, write_tokens
from tessera.errors import ArgumentError


class Tokenizer(Protocol):
    """Text to token ids and back."""

    name: str  # says which tokenizer: part of the cached stream's file name
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens (vocabulary 256)."""

    name = "bytes"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class BPETokenizer:
    """A ``tokenizers.Tokenizer`` (byte-level BPE) read from its JSON file."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer  # an optional dependency (dev extra)

        self.path = Path(path)
        self._tokenizer: Any = HFTokenizer.from_file(str(path))
        self.vocab_size = int(self._tokenizer.get_vocab_size())
        self.name = self.path.stem

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode([int(i) for i in ids]))


def file_digest(path: str | Path) -> str:
    """The first 16 hex digits of the SHA-256 of ``path``'s bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def bpe_tokenizer(text_file: str | Path, vocab: int, cache: str | Path) -> BPETokenizer:
    """A byte-level BPE of at most ``vocab`` tokens trained on ``text_file``, read from
    ``cache`` when trained before (one JSON file per text and vocabulary size)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab < len(alphabet):
        raise ArgumentError(f"bpe_tokenizer: vocab {vocab} is below the {len(alphabet)} bytes")
    text_file = Path(text_file)
    path = Path(cache) / f"{text_file.stem}-{file_digest(text_file)}-bpe{vocab}.json"
    if not path.exists():
        tokenizer = HFTokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab, initial_alphabet=alphabet, show_progress=False
        )
        tokenizer.train([str(text_file)], trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")  # ranks race
        tokenizer.save(str(partial))
        json.loads(partial.read_text())  # written whole
        partial.replace(path)
    return BPETokenizer(path)


def cached_tokens(text_file: str | Path, tokenizer: Tokenizer, cache: str | Path) -> np.ndarray:
    """The tokens of ``text_file`` (UTF-8), memory-mapped from ``cache``: encoded and
    written on first use, keyed by the file's content and the tokenizer's name."""
    text_file = Path(text_file)
    path = Path(cache) / f"{text_file.stem}-{file_digest(text_file)}-{tokenizer.name}.npy"
    if not path.exists():
        write_tokens(path, tokenizer.encode(text_file.read_text(encoding="utf-8")))
    return open_tokens(path)
