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
one changed or one added: most typing errors), which the page shows as "did you mean". A
dropped or swapped letter is found by generating those edits of the word and looking them up
(Norvig's spelling corrector). A changed or added letter is found in an index of the known
words with one letter taken out, built once (SymSpell's idea): generating those edits took 51
lookups a letter (0.12 ms in-process for the 11-letter nonce that every query of the service
benchmark carries); the index takes 2 a letter (0.008 ms).
"""

from __future__ import annotations

import json
from collections import defaultdict
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
        self._one_letter_out = _one_letter_out(self.words)

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
        "red"), two neighbours swapped ("circel" -> "circle"), one changed, one added (each
        a-z); within a kind the alphabetically first known word wins."""
        if len(word) > MAX_CORRECTED_LENGTH:
            return None
        for known in self._near(word):
            if known:
                return min(known)
        return None

    def _near(self, word: str) -> Iterable[set[str]]:
        """The known words one edit from `word`, kind by kind (see `correction`)."""
        splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
        yield {a + b[1:] for a, b in splits if b} & self.words
        yield {
            a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1 and b[0] != b[1]
        } & self.words
        index = self._one_letter_out
        yield {
            known
            for i in range(len(word))
            for known in index.get((i, word[:i] + word[i + 1 :]), ())
            if known != word
        }
        yield {known for i in range(len(word) + 1) for known in index.get((i, word), ())}


def _one_letter_out(words: Iterable[str]) -> dict[tuple[int, str], tuple[str, ...]]:
    """(i, w without its letter i) -> the known words w whose letter i is in a-z: a word is one
    changed letter from w when it has w's key at some i with another letter there, and one
    added letter from w when it is w's key."""
    index: defaultdict[tuple[int, str], list[str]] = defaultdict(list)
    for word in words:
        for i, letter in enumerate(word):
            if letter in LETTERS:
                index[(i, word[:i] + word[i + 1 :])].append(word)
    return {key: tuple(found) for key, found in index.items()}
