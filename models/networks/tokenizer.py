"""Word tokenizer and vocabulary built from training captions, saved as vocab.json."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

PAD, UNK = "<pad>", "<unk>"
PAD_ID, UNK_ID = 0, 1
_WORD = re.compile(r"[a-z0-9]+")


def split_words(text: str) -> list[str]:
    """Lower-case `text` and return its words (runs of letters and digits; punctuation drops)."""
    return _WORD.findall(text.lower())


class Tokenizer:
    """Maps captions to padded id arrays; id 0 is <pad>, id 1 is <unk> (out-of-vocabulary)."""

    def __init__(self, tokens: Sequence[str]) -> None:
        if list(tokens[:2]) != [PAD, UNK]:
            raise ValueError(f"a vocabulary must start with {PAD!r}, {UNK!r}")
        if len(set(tokens)) != len(tokens):
            raise ValueError("a vocabulary must not repeat a token")
        self.tokens: list[str] = list(tokens)
        self._ids = {token: i for i, token in enumerate(self.tokens)}

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def build(cls, texts: Iterable[str], min_count: int = 1) -> Tokenizer:
        """Vocabulary of the words seen at least `min_count` times, most frequent first."""
        counts = Counter(word for text in texts for word in split_words(text))
        words = sorted(
            (w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w)
        )
        return cls([PAD, UNK, *words])

    def encode(self, text: str) -> list[int]:
        """Ids of the words of `text` (unknown words -> <unk>); may be empty."""
        return [self._ids.get(word, UNK_ID) for word in split_words(text)]

    def encode_batch(self, texts: Sequence[str], max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Padded ids and lengths of a batch.

        Returns ids int64 (N, T) with T = the longest caption clipped to `max_len`, and
        lengths int64 (N,) in [1, T]. Words past `max_len` are cut; a caption with no word
        becomes a single <unk> so that every caption has a last hidden state.
        """
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        encoded = [self.encode(text)[:max_len] or [UNK_ID] for text in texts]
        width = max((len(e) for e in encoded), default=1)
        ids = np.full((len(encoded), width), PAD_ID, dtype=np.int64)  # (N, T)
        for row, e in enumerate(encoded):
            ids[row, : len(e)] = e
        lengths = np.array([len(e) for e in encoded], dtype=np.int64)  # (N,)
        return ids, lengths

    def save(self, path: Path | str) -> None:
        """Write the vocabulary as JSON ({"pad", "unk", "tokens": [...]}, id = list position)."""
        data = {"pad": PAD, "unk": UNK, "split": _WORD.pattern, "tokens": self.tokens}
        Path(path).write_text(json.dumps(data, indent=1) + "\n")

    @classmethod
    def load(cls, path: Path | str) -> Tokenizer:
        """Read a vocabulary written by save()."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
            return cls(data["tokens"])
        except FileNotFoundError as e:
            raise ValueError(f"vocabulary {path} not found") from e
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"vocabulary {path} is malformed: {e}") from e
