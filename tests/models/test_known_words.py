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
