"""Which words of a caption query the model never met in training, and when that is enough to
refuse the query.

A model's encoders only learned what its training captions said. The small encoders map an
unseen word to <unk>, and a pretrained text backbone still embeds it, but the heads on top
never learned where it belongs; either way the query's Gaussian then says nothing reliable
("asdf qwerty" came out more certain than "a red circle"). So the words are checked against
the training captions' words (known_words.json, written by training; the small encoders'
vocab.json for models trained before it), the unknown ones are reported with the answer, and
a query whose content words are mostly unknown is refused.

A typo ("redd circel", "pengiun") is an unknown word too, so the check also offers the caption
with each unknown word replaced by a known word one edit away (a letter dropped, two swapped,
one changed or one added: most typing errors), which the page shows as "did you mean". The
edits of a word are generated and looked up (Norvig's spelling corrector), a fixed cost of
about 54 x its length lookups rather than a comparison with every known word.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from models.networks.model_config import VOCAB_FILE
from models.networks.tokenizer import PAD, UNK, Tokenizer, split_words

KNOWN_WORDS_FILE = "known_words.json"
UNKNOWN_WORDS_SCORE = "unknown_words"
# Above this fraction of unknown content words a query is refused: more unknown than known.
UNKNOWN_WORDS_LIMIT = 0.5
# At most this many unknown words of a query are corrected, each of at most this many letters:
# a caption of hundreds of long unknown words costs no more than a short one.
MAX_CORRECTED_WORDS = 8
MAX_CORRECTED_LENGTH = 32
LETTERS = "abcdefghijklmnopqrstuvwxyz"
# Words that carry no content: a query is judged on the others ("a pink hexagon": 2 of 2).
FUNCTION_WORDS = frozenset(
    {
        "a",
        "an",
        "the",
        "of",
        "and",
        "or",
        "with",
        "without",
        "in",
        "on",
        "at",
        "to",
        "by",
        "for",
        "from",
        "its",
        "it",
        "is",
        "are",
        "this",
        "that",
        "these",
        "those",
        "some",
        "there",
        "here",
    }
)


@dataclass(frozen=True)
class WordCheck:
    """A query's content words and those of them the model never met in training."""

    content_words: tuple[str, ...]
    unknown: tuple[str, ...]
    suggestion: str | None = None  # the caption's words with the unknown ones corrected

    @property
    def unknown_fraction(self) -> float:
        """Share of the content words that are unknown (0 for a query without any)."""
        return len(self.unknown) / len(self.content_words) if self.content_words else 0.0

    @property
    def mostly_unknown(self) -> bool:
        return self.unknown_fraction > UNKNOWN_WORDS_LIMIT


class KnownWords:
    """The words of a model's training captions."""

    def __init__(self, words: Iterable[str]) -> None:
        self.words = frozenset(words)

    @classmethod
    def from_captions(cls, captions: Iterable[str]) -> KnownWords:
        return cls(word for text in captions for word in split_words(text))

    @classmethod
    def load(cls, model_dir: Path) -> KnownWords | None:
        """The model's known words; None for a model that records none (pretrained heads
        trained before known_words.json existed: nothing is flagged then)."""
        path = Path(model_dir) / KNOWN_WORDS_FILE
        if path.is_file():
            return cls(json.loads(path.read_text(encoding="utf-8")))
        vocabulary = Path(model_dir) / VOCAB_FILE
        if vocabulary.is_file():
            return cls(t for t in Tokenizer.load(vocabulary).tokens if t not in (PAD, UNK))
        return None

    def save(self, model_dir: Path) -> None:
        path = Path(model_dir) / KNOWN_WORDS_FILE
        path.write_text(json.dumps(sorted(self.words)), encoding="utf-8")

    def check(self, text: str) -> WordCheck:
        """The content words of `text` (in order, repeats once), the unknown ones, and the
        caption's words with each unknown word that has a known one an edit away replaced by
        it (None when none has)."""
        words = split_words(text)
        content = tuple(dict.fromkeys(w for w in words if w not in FUNCTION_WORDS))
        unknown = tuple(w for w in content if w not in self.words)
        corrections = {w: c for w in unknown[:MAX_CORRECTED_WORDS] if (c := self.correction(w))}
        suggestion = " ".join(corrections.get(w, w) for w in words) if corrections else None
        return WordCheck(content, unknown, suggestion)

    def correction(self, word: str) -> str | None:
        """A known word one edit away from `word`, or None. Edits are tried by kind, in the
        order typing errors most often take: a letter dropped from the word ("redd" ->
        "red"), two neighbours swapped ("circel" -> "circle"), one changed, one added; within
        a kind the alphabetically first known word wins."""
        if len(word) > MAX_CORRECTED_LENGTH:
            return None
        for edits in one_edit_away(word):
            known = sorted(edits & self.words)
            if known:
                return known[0]
        return None


def one_edit_away(word: str) -> tuple[set[str], set[str], set[str], set[str]]:
    """The strings one edit from `word`: (a letter deleted, two neighbours transposed, a
    letter replaced, a letter inserted), each over a-z."""
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    deleted = {a + b[1:] for a, b in splits if b}
    transposed = {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1 and b[0] != b[1]}
    replaced = {a + c + b[1:] for a, b in splits if b for c in LETTERS if c != b[0]}
    inserted = {a + c + b for a, b in splits for c in LETTERS}
    return deleted, transposed, replaced, inserted
