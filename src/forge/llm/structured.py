"""Structured output on top of any :class:`~forge.llm.base.LLM`: JSON and constrained choice.

Backends that can constrain decoding natively (llama.cpp grammars, ``response_format``)
say so in ``capabilities`` and get the constraint in the :class:`Request`; for all others,
and as a safety net for all, the reply is parsed tolerantly, validated, and on failure the
model is asked again with the error appended, a bounded number of times. Small local
models need all of it: they wrap JSON in prose and fences, leave trailing commas and answer
"Option B." when asked for "B".
"""

from __future__ import annotations

import difflib
import json
import math
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from forge.errors import StructuredOutputError, UserError
from forge.llm.base import LLM, Message, Request

__all__ = [
    "LogitPick",
    "StructuredOutputError",
    "choose",
    "complete_json",
    "match_option",
    "parse_json_lenient",
    "pick_by_logits",
    "validate_json",
]

Messages = str | Sequence[Message]


# ---------------------------------------------------------------------------------------------
# JSON


def _empty_enum(schema: Any, path: str = "the schema") -> str | None:
    """Where ``schema`` has an enum with no member (None when nowhere)."""
    if not isinstance(schema, Mapping):
        return None
    if "enum" in schema and not list(schema["enum"]):
        return path
    for name, sub in (schema.get("properties") or {}).items():
        found = _empty_enum(sub, f"{path}.{name}")
        if found:
            return found
    return _empty_enum(schema.get("items"), f"{path}[]") if isinstance(schema.get("items"), Mapping) else None


def complete_json(
    llm: LLM,
    messages: Messages,
    *,
    schema: Mapping[str, Any],
    retries: int = 2,
    max_tokens: int = 512,
    temperature: float = 0.0,
    seed: int | None = None,
    instruct: bool = True,
) -> Any:
    """Ask for a JSON value matching ``schema`` and return it parsed (usually a dict).

    ``instruct`` appends the schema to the prompt: even with grammar-constrained decoding a
    model needs to know what the fields mean. Raises :class:`StructuredOutputError` (an
    :class:`LLMError`) after ``retries`` re-asks, with the last raw reply attached.
    """
    empty = _empty_enum(schema)
    if empty is not None:
        # no value can match: asking would only fail, and llama.cpp's grammar for an empty
        # alternative is invalid (a reflection on a TextWorld game's last, action-less state
        # killed the process with no traceback)
        raise StructuredOutputError(f"schema allows no value: {empty} is an empty enum", raw="", attempts=0)
    convo = _as_messages(messages)
    if instruct:
        convo = _append_user(
            convo,
            "Reply with only a JSON value, no prose, matching this JSON schema:\n"
            + json.dumps(schema, separators=(",", ":")),
        )
    native = "json_schema" in llm.capabilities
    errors: list[str] = []
    raw = ""
    for _ in range(retries + 1):
        request = Request(
            messages=convo,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            json_schema=schema if native else None,
        )
        raw = llm.complete(request).text
        try:
            value = parse_json_lenient(raw, prefer=_preferred_opener(schema))
        except ValueError as exc:
            problem = str(exc)
        else:
            problems = validate_json(value, schema)
            if not problems:
                return value
            problem = "; ".join(problems[:5])
        errors.append(problem)
        convo = [
            *convo,
            Message("assistant", raw),
            Message(
                "user",
                f"That reply was not valid: {problem}. "
                "Reply again with only the corrected JSON value.",
            ),
        ]
    raise StructuredOutputError(
        f"{llm.name} gave no valid JSON after {retries + 1} attempts; last problem: {errors[-1]}",
        raw=raw,
        attempts=retries + 1,
        errors=errors,
    )


def _preferred_opener(schema: Mapping[str, Any]) -> str | None:
    kind = schema.get("type")
    if kind == "object" or (kind is None and "properties" in schema):
        return "{"
    if kind == "array":
        return "["
    return None


_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_-]*[ \t]*\n?(.*?)```", re.DOTALL)


def parse_json_lenient(text: str, *, prefer: str | None = None) -> Any:
    """Parse the JSON value a model meant, forgiving the usual slips.

    Tries, in order: the whole text; the inside of a code fence; the first balanced
    ``{...}``/``[...]`` (``prefer`` picks which opener to look for first). Each candidate is
    tried as is and then repaired: trailing commas dropped, single-quoted strings and Python
    ``True``/``False``/``None`` rewritten. Raises ``ValueError`` saying what was wrong.
    """
    stripped = text.strip()
    if not stripped:
        raise ValueError("the reply was empty")
    candidates = [stripped]
    candidates += [m.group(1).strip() for m in _FENCE.finditer(text)]
    openers = "{[" if prefer != "[" else "[{"
    for source in list(candidates):
        for opener in openers:
            candidates += _balanced_blocks(source, opener)
    seen: set[str] = set()
    for candidate in candidates:
        if not candidate or candidate in seen:
            continue
        seen.add(candidate)
        for attempt in (candidate, _repair(candidate)):
            try:
                return json.loads(attempt)
            except json.JSONDecodeError:
                continue
    if not any(ch in stripped for ch in "{["):
        raise ValueError("the reply contained no JSON object or array")
    if not any(_balanced_blocks(c, o) for c in candidates for o in "{["):
        raise ValueError("the reply's JSON was cut off (unbalanced brackets)")
    raise ValueError("the reply's JSON could not be parsed")


def _balanced_blocks(text: str, opener: str, limit: int = 5) -> list[str]:
    """Successive top-level bracketed blocks starting with ``opener``, skipping strings.

    Stops at the first block that is cut off or closed by the wrong bracket: anything after
    it would be a nested fragment, not what the model meant.
    """
    closer = {"{": "}", "[": "]"}[opener]
    blocks: list[str] = []
    start = text.find(opener)
    while start != -1 and len(blocks) < limit:
        depth = 0
        quote: str | None = None
        escaped = False
        end = -1
        for i in range(start, len(text)):
            ch = text[i]
            if quote:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == quote:
                    quote = None
            elif ch == '"' or (ch == "'" and not (i > 0 and text[i - 1].isalnum())):
                quote = ch  # an apostrophe inside a word ("don't") opens no string
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth == 0:
                    end = i if ch == closer else -1
                    break
        if end == -1:
            break
        blocks.append(text[start : end + 1])
        start = text.find(opener, end + 1)
    return blocks


_PY_WORDS = {"True": "true", "False": "false", "None": "null"}


def _repair(text: str) -> str:
    """Rewrite near-JSON into JSON outside of strings only, so string contents are untouched."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif ch == "'":
            j = i + 1
            chars: list[str] = []
            while j < n and text[j] != "'":
                if text[j] == "\\" and j + 1 < n:
                    chars.append(text[j + 1])
                    j += 2
                else:
                    chars.append(text[j])
                    j += 1
            out.append(json.dumps("".join(chars)))
            i = j + 1
        elif ch == ",":
            j = i + 1
            while j < n and text[j].isspace():
                j += 1
            if j < n and text[j] in "}]":
                i += 1  # trailing comma
            else:
                out.append(ch)
                i += 1
        elif ch.isalpha():
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            word = text[i:j]
            out.append(_PY_WORDS.get(word, word))
            i = j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}


def validate_json(value: Any, schema: Mapping[str, Any], path: str = "$") -> list[str]:
    """Check ``value`` against the common subset of JSON Schema; return readable problems.

    Supports ``type`` (one or a list), ``enum``, ``const``, ``properties``, ``required``,
    ``additionalProperties`` (bool or schema), ``items``, ``minItems``/``maxItems``,
    ``minLength``/``maxLength``, ``minimum``/``maximum`` and ``anyOf``/``oneOf``; other
    keywords are ignored. Written here because models need short messages they can act on.
    """
    problems: list[str] = []
    for key in ("anyOf", "oneOf"):
        if key in schema:
            branches = [validate_json(value, sub, path) for sub in schema[key]]
            if all(branches):
                problems.append(f"{path}: matches none of the allowed shapes ({branches[0][0]})")
                return problems
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_is_type(value, k) for k in kinds):
            problems.append(f"{path}: expected {' or '.join(kinds)}, got {_type_name(value)}")
            return problems
    if "const" in schema and value != schema["const"]:
        problems.append(f"{path}: must be {json.dumps(schema['const'])}")
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        problems.append(f"{path}: {json.dumps(value)} is not one of {allowed}")
    if isinstance(value, dict):
        props: Mapping[str, Any] = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                problems.append(f"{path}: missing required field {name!r}")
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in props:
                problems += validate_json(item, props[name], f"{path}.{name}")
            elif extra is False:
                problems.append(f"{path}: unexpected field {name!r}")
            elif isinstance(extra, Mapping):
                problems += validate_json(item, extra, f"{path}.{name}")
    elif isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            problems.append(f"{path}: needs at least {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            problems.append(f"{path}: allows at most {schema['maxItems']} items")
        items = schema.get("items")
        if isinstance(items, Mapping):
            for i, item in enumerate(value):
                problems += validate_json(item, items, f"{path}[{i}]")
    elif isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            problems.append(f"{path}: must be at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            problems.append(f"{path}: must be at most {schema['maxLength']} characters")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            problems.append(f"{path}: must be >= {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            problems.append(f"{path}: must be <= {schema['maximum']}")
    return problems


def _is_type(value: Any, kind: str) -> bool:
    if kind not in _TYPES:
        return True  # unknown type names are not ours to reject
    if isinstance(value, bool) and kind in ("integer", "number"):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES[kind])


def _type_name(value: Any) -> str:
    for name in ("boolean", "integer", "number", "string", "object", "array", "null"):
        if isinstance(value, _TYPES[name]) and not (name == "integer" and isinstance(value, bool)):
            return name
    return type(value).__name__


# ---------------------------------------------------------------------------------------------
# Choice


def choose(
    llm: LLM,
    messages: Messages,
    options: Sequence[str],
    *,
    retries: int = 2,
    fallback: str | None = None,
    max_tokens: int | None = None,
    temperature: float = 0.0,
    seed: int | None = None,
    instruct: bool = True,
) -> str:
    """Return exactly one of ``options``, picked by the model.

    Backends with the ``"choices"`` capability enforce the options themselves: the embedded
    llama.cpp backend scores them from its logits in one pass (:func:`pick_by_logits`) or
    decodes under a grammar; any reply is still
    matched by :func:`match_option` (exact, case-insensitive, option named in the reply,
    closest by difflib). If nothing matches after ``retries`` re-asks, ``fallback`` is
    returned when given (for callers that must act, e.g. a default action), else
    :class:`StructuredOutputError` is raised.
    """
    options = list(options)
    if not options or any(not isinstance(o, str) or not o.strip() for o in options):
        raise UserError("choose() needs a non-empty list of non-empty option strings")
    if len(set(options)) != len(options):
        raise UserError("choose() options must be distinct")
    convo = _as_messages(messages)
    if instruct:
        convo = _append_user(
            convo,
            "Answer with exactly one of these options and nothing else:\n" + _listing(options),
        )
    native = "choices" in llm.capabilities
    if max_tokens is None:
        longest = max(llm.count_tokens(o) for o in options)
        # A grammar may spell an option in more tokens than it tokenizes to alone.
        max_tokens = 2 * longest + 4 if native else max(16, 2 * longest + 8)
    raw = ""
    for _ in range(retries + 1):
        request = Request(
            messages=convo,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            choices=options if native else None,
        )
        raw = llm.complete(request).text
        picked = match_option(raw, options)
        if picked is not None:
            return picked
        convo = [
            *convo,
            Message("assistant", raw),
            Message(
                "user",
                "That is not one of the options. Answer with exactly one of:\n" + _listing(options),
            ),
        ]
    if fallback is not None:
        return fallback
    raise StructuredOutputError(
        f"{llm.name} did not pick one of {len(options)} options after {retries + 1} attempts",
        raw=raw,
        attempts=retries + 1,
    )


@dataclass(frozen=True, slots=True)
class LogitPick:
    """What :func:`pick_by_logits` chose and what it cost.

    ``index`` is the chosen path; ``evaluated`` the tokens run through the model after the
    prompt to reach it, in ``evals`` calls; ``p`` the product, over the branch points, of the
    pick's share of the softmax over the competing tokens (1.0 when there was no choice).
    """

    index: int
    evaluated: int = 0
    evals: int = 0
    p: float = 1.0


def pick_by_logits(
    paths: Sequence[Sequence[int]],
    logits: Sequence[float],
    extend: Callable[[Sequence[int]], Sequence[float]],
    *,
    end: int,
    temperature: float = 0.0,
    seed: int | None = None,
) -> LogitPick:
    """Choose one token path (an option, tokenized) from next-token logits, walking the
    options' token trie only where they share a prefix.

    ``logits`` are the model's after the prompt; ``extend(tokens)`` evaluates ``tokens`` after
    everything evaluated so far and returns the logits after the last one. Where the live
    paths part, the one whose next token has the highest logit wins (or one is sampled at
    ``temperature``, reproducibly from ``seed``); a path that ends where others go on competes
    with the ``end`` token (end of turn). Tokens every live path shares are evaluated in one
    batch, and only when a later branch needs the logits after them: "restore User1" against
    "restore User2" costs one ``extend`` of ``["restore", " User"]``, and options that differ
    in their first token cost none. This is greedy decoding restricted to the options'
    canonical tokenization, without a grammar or a generated token that is not needed.
    """
    if not paths or any(len(p) == 0 for p in paths):
        raise UserError("pick_by_logits needs at least one non-empty token path")
    if len({tuple(p) for p in paths}) != len(paths):
        raise UserError("pick_by_logits needs distinct token paths")
    rng = random.Random(seed) if temperature > 0 else None
    alive = list(range(len(paths)))
    depth, evaluated, evals, p = 0, 0, 0, 1.0
    pending: list[int] = []
    while len(alive) > 1:
        groups: dict[int, list[int]] = {}
        for i in alive:
            groups.setdefault(paths[i][depth] if depth < len(paths[i]) else end, []).append(i)
        if len(groups) == 1:  # a shared token: no decision here
            pending.append(next(iter(groups)))
            depth += 1
            continue
        if pending:
            logits = extend(pending)
            evaluated, evals, pending = evaluated + len(pending), evals + 1, []
        tokens = list(groups)
        scale = temperature if temperature > 0 else 1.0
        scores = [float(logits[t]) / scale for t in tokens]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        total = sum(weights)
        if rng is None:
            k = scores.index(top)
        else:
            k = rng.choices(range(len(tokens)), weights=weights)[0]
        p *= weights[k] / total
        alive = groups[tokens[k]]
        if tokens[k] == end:
            break
        pending.append(tokens[k])
        depth += 1
    return LogitPick(alive[0], evaluated, evals, p)


def _listing(options: Sequence[str]) -> str:
    return "\n".join(f"- {o}" for o in options)


_EDGE = " \t\r\n\"'`*.:;,!?()[]{}<>-"


def match_option(reply: str, options: Sequence[str], *, cutoff: float = 0.6) -> str | None:
    """Map a free-text reply to one option, or ``None`` when no reading is convincing.

    Order: exact; exact after trimming quotes, bullets and punctuation; case-insensitive;
    an option named as a whole word in the reply (earliest mention, longest on ties, so
    "go north" beats "go"); the closest option by difflib ratio above ``cutoff``.
    """
    if reply in options:
        return reply
    text = reply.strip()
    first = text.splitlines()[0].strip(_EDGE) if text else ""
    for candidate in (text, text.strip(_EDGE), first):
        if candidate in options:
            return candidate
    folded = {o.casefold().strip(): o for o in options}
    for candidate in (text, text.strip(_EDGE), first):
        if candidate.casefold() in folded:
            return folded[candidate.casefold()]
    hits: list[tuple[int, int, str]] = []
    lowered = text.casefold()
    for option in options:
        pattern = r"(?<!\w)" + re.escape(option.casefold().strip()) + r"(?!\w)"
        found = re.search(pattern, lowered)
        if found:
            hits.append((found.start(), -len(option), option))
    if hits:
        return min(hits)[2]
    close = difflib.get_close_matches(first.casefold(), list(folded), n=1, cutoff=cutoff)
    return folded[close[0]] if close else None


# ---------------------------------------------------------------------------------------------


def _as_messages(messages: Messages) -> list[Message]:
    if isinstance(messages, str):
        return [Message("user", messages)]
    return list(messages)


def _append_user(convo: list[Message], note: str) -> list[Message]:
    """Add an instruction to the last user turn (small chat models follow it best there)."""
    if convo and convo[-1].role == "user":
        return [*convo[:-1], Message("user", f"{convo[-1].content}\n\n{note}")]
    return [*convo, Message("user", note)]
