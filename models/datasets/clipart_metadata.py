"""What the authors of the Open Clip Art Library wrote about each drawing, cleaned into captions
and labels (docs/data-format.md, "The clip-art dataset", lists these rules).

Each SVG carries a Dublin Core title, an optional description and a bag of keywords. The text
is real and noisy: collection names instead of titles ("gramastar" on 1,375 stars, "Part of the
Flat Icon Collection (Wed Aug 25 ...)"), hashes, file names, tool tags ("hash", "magick"). The
rules below drop what describes the collection or the file rather than the drawing; what is left
is the author's own words, untranslated and unedited otherwise.

The XML is read with the standard library's expat parser, which resolves no external entity and
(expat >= 2.4) refuses entity expansion past a fixed amplification, so a hostile SVG cannot make
the reader fetch a file or blow up memory.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

NAMESPACES = {
    "dc": "http://purl.org/dc/elements/1.1/",
    "rdf": "http://www.w3.org/1999/02/22-rdf-syntax-ns#",
    "cc": "http://web.resource.org/cc/",
}
# A title or description used by at least this many drawings names a collection, not a drawing.
SHARED_TEXT_MIN = 10
MAX_CAPTION_WORDS = 40
MAX_KEYWORDS_IN_CAPTION = 5
# Keywords that tag the tool or the collection a drawing came from, not what it shows.
TOOL_KEYWORDS = frozenset(
    {
        "hash",
        "theme",
        "magick",
        "mapsym",
        "mimeicon",
        "appicon",
        "lemon theme icon",
        "svg",
        "clipart",
        "clip art",
        "openclipart",
        "unsorted",
        "special",
        "image",
        "picture",
    }
)
FILE_EXTENSION = re.compile(r"\.(svg|svgz|png|jpe?g|gif|eps|ai|pdf)$", re.IGNORECASE)
HASH_TEXT = re.compile(r"HASH\(0x[0-9a-f]+\)", re.IGNORECASE)
COLLECTION_TITLE = re.compile(r"^clipart by |collection|icon ?set\b|\bsvg theme\b", re.IGNORECASE)
URL = re.compile(r"(https?://|www\.)\S+", re.IGNORECASE)
# An e-mail address with the label an author put before it ("contact:", "Email:").
EMAIL = re.compile(r"(\b(e-?mail|mail|contact)\s*:?\s*)?[\w.+-]+@[\w-]+(\.[\w-]+)+", re.IGNORECASE)
EMPTY_BRACKETS = re.compile(r"\(\s*\)")
SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([.,;:!?])")
REPEATED_PUNCTUATION = re.compile(r"([.,;:!?])[.,;:!?]+")
NUMBER_OR_HEX = re.compile(r"^(0x[0-9a-f]+|[0-9]+)$")
GLUED_DIGITS = re.compile(r"\b([A-Za-z]{4,})\d+\b")  # "cake1" -> "cake", "MP3" stays
WORDS = re.compile(r"[a-z0-9]+")


class MetadataError(ValueError):
    """An SVG whose XML cannot be read (truncated, malformed, or an entity bomb expat refused)."""


@dataclass(frozen=True)
class AuthorText:
    """The metadata of one drawing as its author wrote it (stripped, nothing else changed)."""

    title: str
    description: str
    keywords: tuple[str, ...]


def read_author_text(svg: bytes) -> AuthorText:
    """The dc:title, dc:description and rdf:li keywords of the drawing's cc:Work."""
    try:
        root = ET.fromstring(svg)
    except ET.ParseError as exc:
        raise MetadataError(f"not well-formed XML ({exc})") from exc
    work = root.find(".//cc:Work", NAMESPACES)
    if work is None:
        return AuthorText("", "", ())
    keywords = tuple(
        (li.text or "").strip() for li in work.findall("dc:subject/rdf:Bag/rdf:li", NAMESPACES)
    )
    return AuthorText(_text_of(work, "dc:title"), _text_of(work, "dc:description"), keywords)


def _text_of(work: ET.Element, tag: str) -> str:
    element = work.find(tag, NAMESPACES)
    return " ".join((element.text or "").split()) if element is not None else ""


def normalise_keyword(keyword: str) -> str:
    """Lower case, "_" "-" "/" as spaces, punctuation dropped, spaces collapsed."""
    return " ".join(WORDS.findall(keyword.lower().replace("_", " ")))


def clean_keywords(keywords: Iterable[str], plural_of: dict[str, str]) -> tuple[str, ...]:
    """The drawing's keywords, normalised, without tool tags, numbers or hex, without repeats,
    and with a plural folded to its singular where `plural_of` says the library has both."""
    out: list[str] = []
    for keyword in keywords:
        word = normalise_keyword(keyword)
        word = plural_of.get(word, word)
        if word and word not in TOOL_KEYWORDS and not NUMBER_OR_HEX.match(word) and word not in out:
            out.append(word)
    return tuple(out)


def plural_folding(all_keywords: Iterable[str]) -> dict[str, str]:
    """ "stars" -> "star" for every normalised keyword ending in "s" whose singular is also a
    keyword of the library: authors tag the same thing both ways."""
    words = {normalise_keyword(k) for k in all_keywords}
    return {w: w[:-1] for w in words if len(w) > 3 and w.endswith("s") and w[:-1] in words}


def clean_title(title: str, shared: Counter[str]) -> str:
    """The title as a caption, or "" when it names a collection, a file or a hash."""
    if not title or HASH_TEXT.search(title) or FILE_EXTENSION.search(title):
        return ""
    if COLLECTION_TITLE.search(title) or shared[title] >= SHARED_TEXT_MIN:
        return ""
    text = GLUED_DIGITS.sub(r"\1", without_addresses(title.replace("_", " ")))
    return text if _has_word(text) else ""


def clean_description(description: str, title: str, shared: Counter[str]) -> str:
    """The description as a caption (URLs and e-mail addresses removed, cut to
    MAX_CAPTION_WORDS words), or "" when it is a hash, shared by many drawings, or says no more
    than the title."""
    if not description or HASH_TEXT.search(description) or shared[description] >= SHARED_TEXT_MIN:
        return ""
    text = " ".join(without_addresses(description).split()[:MAX_CAPTION_WORDS])
    if not _has_word(text) or text.lower() == title.lower():
        return ""
    return text


def without_addresses(text: str) -> str:
    """`text` without URLs and e-mail addresses (and an "Email:" or "contact:" before one), with
    the brackets and punctuation they leave behind tidied, on one line: an address names the
    author, not the drawing, and a caption made of one would be a search for a person."""
    kept = EMAIL.sub(" ", URL.sub(" ", text))
    if kept == text:
        return " ".join(text.split())
    kept = SPACE_BEFORE_PUNCTUATION.sub(r"\1", EMPTY_BRACKETS.sub(" ", kept))
    return REPEATED_PUNCTUATION.sub(r"\1", " ".join(kept.split())).strip(" ,;:")


def keyword_caption(keywords: Sequence[str], category: str) -> str:
    """ "a drawing of <keywords>", the first MAX_KEYWORDS_IN_CAPTION of them in the author's
    order; the category's last folder stands in for a drawing without keywords."""
    named = list(keywords[:MAX_KEYWORDS_IN_CAPTION]) or [normalise_keyword(category.split("/")[-1])]
    return "a drawing of " + ", ".join(w for w in named if w)


def _has_word(text: str) -> bool:
    """At least one run of two or more letters."""
    return re.search(r"[^\W\d_]{2,}", text) is not None


def keywords_named(text: str, keywords: Iterable[str]) -> tuple[str, ...]:
    """The keywords (normalised, possibly several words) that stand in `text` as whole words,
    a plural in the text counting for its singular keyword."""
    words = WORDS.findall(text.lower())
    singular = [w[:-1] if len(w) > 3 and w.endswith("s") else w for w in words]
    spans = {
        " ".join(ws[i : i + n])
        for ws in (words, singular)
        for n in (1, 2, 3, 4)
        for i in range(len(ws) - n + 1)
    }
    return tuple(k for k in keywords if k in spans)
