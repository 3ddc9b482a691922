"""The screen's normalisation: the views of one text the detectors read, and its clauses.

Obfuscation should not hide a match, so a text is read in several *views*: NFKC with
look-alike letters folded to Latin and accents dropped; markup stripped with hidden HTML
(comments, ``display:none``, ``alt``/``title``) surfaced; HTML entities, URL escapes,
``\\x``/``\\u`` escapes, base64 runs and rot13 decoded; leetspeak undone (``1gn0r3`` ->
``ignore``) and split tokens joined (``i g n o r e``, ``ign-ore``).
"""

from __future__ import annotations

import base64
import binascii
import codecs
import contextlib
import html
import re
import unicodedata
import urllib.parse

__all__ = ["clause_spans", "views"]


def _strip_accents(text: str) -> str:
    """Accents off Latin letters only (``précédentes`` -> ``precedentes``); other scripts kept."""
    if text.isascii():
        return text
    out: list[str] = []
    for c in unicodedata.normalize("NFKD", text):
        if unicodedata.combining(c) and out and out[-1].isascii():
            continue
        out.append(c)
    return unicodedata.normalize("NFC", "".join(out))


# ---------------------------------------------------------------------------------------------
# Folding: leetspeak, look-alike letters, invisible characters


_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s", "!": "i", "|": "l", "+": "t", "€": "e", "8": "b", "9": "g"})

#: Cyrillic and Greek letters that look like Latin ones (NFKC leaves them alone).
_CONFUSABLES = str.maketrans(
    "АВЕКМНОРСТХУаеорсухіјѕԁӏɡІЈЅӀԚԜһԛԝΑΒΕΖΗΙΚΜΝΟΡΤΥΧαοριυνκτ",
    "ABEKMHOPCTXYaeopcyxijsdlgIJSIQWhqwABEZHIKMNOPTYXaopiuvkt",
)

# Invisible characters and direction overrides (the shape checks report them; folding drops them).
_HIDDEN = re.compile("[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\u3164\ufeff\uffa0\U000e0000-\U000e007f]")
_TAGS = re.compile("[\U000e0020-\U000e007e]")  # Unicode tag characters can smuggle ASCII


# ---------------------------------------------------------------------------------------------
# Normalisation: views of one text


_MARKUP_HIDDEN = re.compile(
    r"<!--(.{0,2000}?)-->"
    r"|<(\w+)[^>]{0,400}?(?:display\s*:\s*none|visibility\s*:\s*hidden|font-size\s*:\s*0|opacity\s*:\s*0(?:\.0+)?\b|color\s*:\s*(?:white|#fff(?:fff)?\b|transparent)|\bhidden\b|aria-hidden)[^>]{0,400}>(.{0,2000}?)</\2\s*>",
    re.IGNORECASE | re.DOTALL,
)
_ATTR_TEXT = re.compile(r"\b(?:alt|title|aria-label|data-[\w-]+|content)\s*=\s*(['\"])(.*?)\1", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]{0,400}>")
_B64_RUN = re.compile(r"(?<![A-Za-z0-9+/_=-])[A-Za-z0-9+/_-]{16,}={0,2}(?![A-Za-z0-9+/_=-])")
_HEX_RUN = re.compile(r"(?<![0-9A-Fa-f])(?:[0-9A-Fa-f]{2}){12,}(?![0-9A-Fa-f])")
_ESCAPES = re.compile(r"(?:\\x[0-9A-Fa-f]{2}|\\u[0-9A-Fa-f]{4}){3,}")


_LOOKALIKE_SCRIPT = re.compile(r"[\u0370-\u03ff\u0400-\u04ff\u0500-\u052f]")
_LATIN = re.compile(r"[A-Za-z]")
_WORD = re.compile(r"\w+")


def _unconfuse(m: re.Match[str]) -> str:
    word = m.group(0)
    # Only a word that mixes Latin with look-alikes is a disguise; Russian or Greek is not.
    if _LATIN.search(word) and _LOOKALIKE_SCRIPT.search(word):
        return word.translate(_CONFUSABLES)
    return word


def _fold(text: str) -> str:
    """NFKC, invisible characters out, look-alike letters to Latin, accents dropped."""
    t = unicodedata.normalize("NFKC", _HIDDEN.sub("", _TAGS.sub("", text)))
    if _LOOKALIKE_SCRIPT.search(t):
        t = _WORD.sub(_unconfuse, t)
    return _strip_accents(t)


def _printable(raw: bytes) -> str | None:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if len(text) < 6:
        return None
    good = sum(1 for c in text if c.isprintable() or c in "\n\t")
    letters = sum(1 for c in text if c.isalpha())
    if good / len(text) < 0.95 or letters / len(text) < 0.5 or " " not in text.strip():
        return None
    return text


def _decoded(text: str) -> list[str]:
    """Text hidden in base64, hex and escape sequences, where it decodes to readable words."""
    out = []
    for m in _B64_RUN.finditer(text):
        run = m.group(0)
        if run.isalpha() and (run.islower() or run.isupper()):
            continue  # a long word, not an encoding
        for alt in (False, True):
            try:
                pad = run + "=" * (-len(run) % 4)
                raw = base64.urlsafe_b64decode(pad) if alt else base64.b64decode(pad, validate=True)
            except (binascii.Error, ValueError):
                continue
            dec = _printable(raw)
            if dec:
                out.append(dec)
                break
    for m in _HEX_RUN.finditer(text):
        dec = _printable(bytes.fromhex(m.group(0)))
        if dec:
            out.append(dec)
    for m in _ESCAPES.finditer(text):
        with contextlib.suppress(UnicodeDecodeError, ValueError):
            out.append(codecs.decode(m.group(0), "unicode_escape"))
    return out


def _split_tokens(text: str) -> str:
    """Letters only, lower case, de-leeted: ``i-g-n 0 r e`` -> ``ignore``."""
    return re.sub(r"[^a-z]", "", text.lower().translate(_LEET))


_LEET_HINT = re.compile(r"[A-Za-z][0-9@$!|+€]|[0-9@$!|+€][A-Za-z]")
_LEET_TOKEN = re.compile(r"[\w@$!|+€]+")
_NUMBERISH = re.compile(r"[\d.,:/-]+\w{0,2}")


def _deleet(text: str) -> str:
    """Undo digit/symbol-for-letter swaps inside words that mix both (``1gn0r3``)."""

    def fix(m: re.Match[str]) -> str:
        w = m.group(0)
        if any(c.isalpha() for c in w) and any(not c.isalpha() for c in w) and not _NUMBERISH.fullmatch(w):
            return w.translate(_LEET)
        return w

    if not _LEET_HINT.search(text):
        return text
    return _LEET_TOKEN.sub(fix, text)


def _join_spaced(text: str) -> str:
    """Join runs of single characters separated by spaces/dots/dashes: ``i g n o r e``."""
    return re.sub(
        r"\b(?:\w[\s.\-_*·]{1,3}){3,}\w\b",
        lambda m: re.sub(r"[\s.\-_*·]", "", m.group(0)),
        text,
    )


_OBF_EMAIL = re.compile(
    r"([\w+-]{1,64}(?:(?:\s*[\[\(\{<]\s*dot\s*[\]\)\}>]\s*|\s+dot\s+|\.)[\w+-]{1,64}){0,6})"
    r"(?:\s*[\[\(\{<]\s*(?:at|@)\s*[\]\)\}>]\s*|\s+at\s+|\s*＠\s*|\s+@\s*|\s*@\s+)"
    r"([\w-]{1,63}(?:(?:\s*[\[\(\{<]\s*dot\s*[\]\)\}>]\s*|\s+dot\s+|\s*\.\s*)[\w-]{1,63}){1,8})",
    re.IGNORECASE,
)
_AT_HINT = re.compile(r"[@＠]|[\[\(\{<]\s*at\s*[\]\)\}>]|\sat\s", re.IGNORECASE)
_DOTS = re.compile(r"\s*[\[\(\{<]\s*dot\s*[\]\)\}>]\s*|\s+dot\s+|\s*\.\s*", re.IGNORECASE)


def _pii_view(text: str) -> str:
    """Obfuscated addresses put back together: ``alice [at] example [dot] com``.

    A plain `` at `` counts only when the domain is spelled with `` dot `` too, so "the
    status page at status.example.com" stays a sentence.
    """

    def join(m: re.Match[str]) -> str:
        sep = m.group(0)[len(m.group(1)) : len(m.group(0)) - len(m.group(2))]
        if re.fullmatch(r"\s+at\s+", sep, re.IGNORECASE) and not re.search(r"\bdot\b", m.group(2), re.IGNORECASE):
            return m.group(0)
        domain = _DOTS.sub(".", m.group(2))
        if not re.search(r"\.[a-z]{2,12}$", domain, re.IGNORECASE):
            return m.group(0)
        return f"{_DOTS.sub('.', m.group(1))}@{domain}"

    if not _AT_HINT.search(text):
        return text
    return _OBF_EMAIL.sub(join, text)


def views(text: str) -> dict[str, str]:
    """The text as the detectors see it: the layers of normalisation, each kept apart.

    ``folded`` (NFKC, look-alikes, accents), ``markup`` (tags stripped, hidden HTML and
    entities surfaced, URL escapes decoded), ``decoded`` (base64/hex/escape payloads and
    rot13 when the text mentions it), ``deleet`` (leetspeak undone, spaced letters joined).
    """
    folded = _fold(text)
    hidden = " ".join(g for m in _MARKUP_HIDDEN.finditer(folded) for g in (m.group(1), m.group(3)) if g)
    attrs = " ".join(m.group(2) for m in _ATTR_TEXT.finditer(folded))
    markup = html.unescape(_TAG.sub(" ", folded))
    if "%" in markup:
        markup = urllib.parse.unquote_plus(markup) if re.search(r"%[0-9A-Fa-f]{2}", markup) else markup
    markup = " ".join(x for x in (markup, html.unescape(hidden), html.unescape(attrs)) if x.strip())
    decoded = _decoded(markup)
    if re.search(r"\brot[\s-]?13\b", markup, re.IGNORECASE):
        decoded.append(codecs.decode(markup, "rot13"))
    decoded_text = " \n".join(_fold(d) for d in decoded)
    out = {"folded": folded, "markup": markup}
    if decoded_text:
        out["decoded"] = decoded_text
    leet = _join_spaced(_deleet(markup + (" \n" + decoded_text if decoded_text else "")))
    if leet != markup:
        out["deleet"] = leet
    return out


# ---------------------------------------------------------------------------------------------
# Clauses: what the semantic layer also reads on its own

_WORD_TOKEN = re.compile(r"(?u)\b\w\w+\b")

# Where a text's clauses end: a sentence's end, a semicolon, a line break, a bullet, or the
# number of the next step in an inline checklist ("1) ... 2) ...", "Step 3: ...").
_CLAUSE_BREAK = re.compile(r"(?<=[.!?])\s+|;\s*|\s*\n\s*|\s+[-\u2022*]\s+|\s+(?=\(?\d{1,2}[.):]\s)|\s+(?=step\s+\d{1,2}\b)", re.IGNORECASE)
MAX_CLAUSES = 12


def clause_spans(text: str) -> list[tuple[int, int]]:
    """The character spans of ``text``'s clauses of at least three words, when it has two
    or more (else none: the text is one clause). A harmful step inside an ordinary
    checklist scores low over the whole text and high on its own."""
    spans, start = [], 0
    for m in [*_CLAUSE_BREAK.finditer(text), None]:
        end = m.start() if m is not None else len(text)
        if len(_WORD_TOKEN.findall(text[start:end])) >= 3:
            spans.append((start, end))
        if m is not None:
            start = m.end()
    return spans[:MAX_CLAUSES] if len(spans) >= 2 else []

