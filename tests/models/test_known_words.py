"""Unknown words of a caption query (models.scoring.known_words): content words only, the
refusal rule, and where a model's known words come from."""

from hypothesis import given
from hypothesis import strategies as st

from models.networks.tokenizer import Tokenizer
from models.scoring.known_words import (
    FUNCTION_WORDS,
    KNOWN_WORDS_FILE,
    UNKNOWN_WORDS_LIMIT,
    KnownWords,
)

KNOWN = KnownWords.from_captions(["A big red circle left of a blue square", "two green stars"])


def test_the_issues_queries() -> None:
    assert KNOWN.check("asdf qwerty").unknown == ("asdf", "qwerty")
    pink = KNOWN.check("a pink hexagon")
    assert pink.content_words == ("pink", "hexagon") and pink.mostly_unknown
    assert KNOWN.check("ein roter Kreis").unknown == ("ein", "roter", "kreis")
    assert KNOWN.check("redd circel").mostly_unknown
    assert KNOWN.check("two blue squares").unknown == ("squares",)  # flagged, not refused
    assert not KNOWN.check("two blue squares").mostly_unknown
    assert KNOWN.check("A RED circle!").unknown == ()
    assert KNOWN.check("the of a").content_words == () and not KNOWN.check("").mostly_unknown


@given(st.lists(st.sampled_from(["red", "circle", "blue", "zebra", "qwerty", "the", "a"])))
def test_refused_exactly_when_more_content_words_are_unknown_than_known(words) -> None:
    check = KNOWN.check(" ".join(words))
    content = list(dict.fromkeys(w for w in words if w not in FUNCTION_WORDS))
    unknown = [w for w in content if w in ("zebra", "qwerty")]
    assert list(check.unknown) == unknown
    assert check.mostly_unknown == (
        bool(content) and len(unknown) / len(content) > UNKNOWN_WORDS_LIMIT
    )


def test_known_words_round_trip_and_old_models_fall_back_to_their_vocabulary(tmp_path) -> None:
    KNOWN.save(tmp_path)
    assert KnownWords.load(tmp_path).words == KNOWN.words
    old = tmp_path / "old"
    old.mkdir()
    assert KnownWords.load(old) is None  # pretrained heads from before: nothing is flagged
    Tokenizer.build(["a red circle"]).save(old / "vocab.json")
    assert KnownWords.load(old).words == {"a", "red", "circle"}
    assert not (old / KNOWN_WORDS_FILE).exists()


def edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance by dynamic programming: deletions, insertions,
    substitutions and transpositions of neighbours, each costing 1."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(
                d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])
            )
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


WORDS = st.text(alphabet="abcde", min_size=1, max_size=6)


@given(WORDS, st.sets(WORDS, max_size=30))
def test_a_correction_is_a_known_word_one_edit_away_and_none_means_there_is_none(
    word: str, known: set[str]
) -> None:
    correction = KnownWords(known).correction(word)
    near = {k for k in known if edit_distance(word, k) == 1}
    if correction is None:
        assert not near
    else:
        assert correction in near


def norvig_correction(word: str, known: set[str]) -> str | None:
    """The reference: generate every string one edit from `word` (a letter deleted, two
    neighbours transposed, a letter replaced by a-z, an a-z letter inserted), look each kind
    up in turn, and take the alphabetically first known word of the first kind that has one."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    kinds = (
        {a + b[1:] for a, b in splits if b},
        {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1 and b[0] != b[1]},
        {a + c + b[1:] for a, b in splits if b for c in letters if c != b[0]},
        {a + c + b for a, b in splits for c in letters},
    )
    for edits in kinds:
        if found := sorted(edits & known):
            return found[0]
    return None


MIXED = st.text(alphabet="abcd1", min_size=0, max_size=6)


@given(MIXED, st.sets(MIXED, max_size=40))
def test_the_correction_is_the_one_generating_every_edit_finds(word: str, known: set[str]) -> None:
    assert KnownWords(known).correction(word) == norvig_correction(word, known)


def test_typos_are_corrected_dropped_letters_first() -> None:
    assert KNOWN.check("redd circel").suggestion == "red circle"
    assert KNOWN.check("a bleu sqare").suggestion == "a blue square"
    assert KnownWords({"red", "reed"}).correction("redd") == "red"  # not the changed letter
    assert KNOWN.check("asdf qwerty").suggestion is None
    assert KNOWN.check("a red circle").suggestion is None


def test_at_most_eight_words_of_a_caption_are_corrected() -> None:
    check = KNOWN.check(" ".join(["redd"] * 3 + [f"re{c}d" for c in "abcefghi"]))
    assert check.suggestion is not None
    corrected = check.suggestion.split()
    assert corrected[:3] == ["red"] * 3  # one unknown word, corrected everywhere
    assert corrected[3:10] == ["red"] * 7 and corrected[10] == "reid"  # the 9th unknown word
    assert KnownWords({"a" * 40}).correction("a" * 41) is None  # past the length cap
