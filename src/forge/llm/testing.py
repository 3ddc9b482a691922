"""Test doubles for the LLM port, shipped so users can test their own agents offline.

``ScriptedLLM`` replays answers you wrote (or computes them from the request) and records
every request it saw; ``EchoLLM`` repeats the last user message; ``WalkerLLM`` walks at
random but obeys the rules in its prompt (a stand-in agent that visibly learns). Both count tokens with a
deterministic word counter, so token accounting is testable to the exact number.
"""

from __future__ import annotations

import json
import random
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from forge.errors import LLMError
from forge.llm.base import Completion, Request, forbid_real_llms

__all__ = ["EchoLLM", "ScriptedLLM", "WalkerLLM", "count_words", "example_for_schema", "forbid_real_llms"]

Reply = str | Completion | BaseException
Script = Iterable[Reply] | Callable[[Request], str | Completion]

_TOKEN = re.compile(r"\w+|[^\w\s]")


def count_words(text: str) -> int:
    """Deterministic stand-in for a tokenizer: one token per word or punctuation mark."""
    return len(_TOKEN.findall(text))


def example_for_schema(schema: Mapping[str, Any]) -> Any:
    """A small value that satisfies a simple JSON schema; the default answer to JSON requests."""
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return example_for_schema(schema[key][0])
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = kind[0] if kind else "string"
    if kind == "object":
        props = schema.get("properties", {})
        return {name: example_for_schema(sub) for name, sub in props.items()}
    if kind == "array":
        count = int(schema.get("minItems", 0))
        return [example_for_schema(schema.get("items", {})) for _ in range(count)]
    if kind == "integer":
        return int(schema.get("minimum", 0))
    if kind == "number":
        return float(schema.get("minimum", 0))
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return "x" * int(schema.get("minLength", 1))


def _default_reply(request: Request) -> str:
    """What a backend that always obeys would say: first choice, a schema example, or 'ok'."""
    if request.choices:
        return request.choices[0]
    if request.json_schema is not None:
        return json.dumps(example_for_schema(request.json_schema))
    return "ok"


class ScriptedLLM:
    """An LLM that answers from a script and remembers what it was asked.

    ``replies`` is a sequence whose items are returned in order (a ``str``, a ready
    :class:`Completion`, or an exception to raise), or a callable that receives the
    :class:`Request` and returns a ``str`` or :class:`Completion`. With no script it obeys
    every constraint (first choice, a minimal schema instance, else ``"ok"``), like a perfect
    model, and advertises both capabilities. When a list runs out it raises
    :class:`LLMError` unless ``repeat_last`` is set.

    With a script, ``capabilities`` defaults to none, so the structured layer's parsing and
    retries are exercised. With ``"choices"`` advertised, an answer equal to an option up to case and
    surrounding space comes back as that option (as a grammar would force); any other answer
    is passed through unchanged so the caller's repair path stays testable.
    """

    def __init__(
        self,
        replies: Script | None = None,
        *,
        capabilities: Iterable[str] | None = None,
        name: str = "scripted",
        repeat_last: bool = False,
    ) -> None:
        if capabilities is None:
            capabilities = ("json_schema", "choices") if replies is None else ()
        self.name = name
        self.capabilities = frozenset(capabilities)
        self.requests: list[Request] = []
        self.closed = False
        self._repeat_last = repeat_last
        self._lock = threading.Lock()
        self._fn: Callable[[Request], str | Completion] | None = None
        self._queue: list[Reply] = []
        self._last: Reply | None = None
        if replies is None:
            self._fn = _default_reply
        elif callable(replies):
            self._fn = replies
        elif isinstance(replies, str | Completion):
            self._queue = [replies]
        else:
            self._queue = list(replies)

    @property
    def calls(self) -> int:
        return len(self.requests)

    @property
    def last_request(self) -> Request:
        if not self.requests:
            raise LLMError(f"{self.name} has not been called yet")
        return self.requests[-1]

    def count_tokens(self, text: str) -> int:
        return count_words(text)

    def complete(self, request: Request) -> Completion:
        with self._lock:
            self.requests.append(request)
            reply = self._next(request)
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, Completion):
            return reply
        text = self._apply_choices(str(reply), request.choices)
        return Completion(
            text=text,
            prompt_tokens=sum(count_words(m.content) for m in request.messages),
            completion_tokens=count_words(text),
            model=self.name,
        )

    def _next(self, request: Request) -> Reply:
        if self._fn is not None:
            return self._fn(request)
        if self._queue:
            self._last = self._queue.pop(0)
            return self._last
        if self._repeat_last and self._last is not None:
            return self._last
        raise LLMError(
            f"{self.name} ran out of scripted replies after {len(self.requests) - 1} calls; "
            "add replies or pass repeat_last=True"
        )

    def _apply_choices(self, text: str, choices: Sequence[str] | None) -> str:
        if not choices or "choices" not in self.capabilities:
            return text
        folded = text.strip().casefold()
        for option in choices:
            if option.strip().casefold() == folded:
                return option
        return text

    def close(self) -> None:
        self.closed = True

    def __repr__(self) -> str:
        return f"ScriptedLLM(name={self.name!r}, calls={self.calls})"


class EchoLLM(ScriptedLLM):
    """Replies with the last user message; handy for checking what a prompt builder sent."""

    def __init__(self, *, capabilities: Iterable[str] = (), name: str = "echo") -> None:
        super().__init__(self._echo, capabilities=capabilities, name=name)

    @staticmethod
    def _echo(request: Request) -> str:
        for message in reversed(request.messages):
            if message.role == "user":
                return message.content
        return ""


_LEAN = {"down": 3.0, "right": 3.0}  # FrozenLake's goal is bottom-right: a walk that gets there sometimes
_HERE = "Memory for this situation:"


def _flagged_here(user: str, options: Sequence[str]) -> set[str]:
    """What the rules the prompt lists under "Memory for this situation:" forbid.

    The policy matched those rules to the env's own situation (``EnvSpec.situation``: "down:
    hole", "exploit on a User host"), which the stand-in cannot compute from the prompt, so it
    takes the prompt's word that they apply here, as a model reading it would.
    """
    from forge.learn import rules

    _, found, block = user.partition(_HERE)
    out: set[str] = set()
    if not found:
        return out
    for line in block.splitlines()[1:]:
        if not line.startswith("- "):
            break
        parsed = rules.parse(line[2:].strip(), options)
        if parsed is not None:
            out.update(parsed.avoid)
    return out


class WalkerLLM:
    """A deterministic stand-in model for agents and swarms: a seeded walk that obeys its rules.

    For an action choice it removes the actions that a rule in the prompt ("when <situation>,
    do not <action>", parsed by :mod:`forge.learn.rules`) forbids in the current situation (its
    first sentence, or the prompt's "Memory for this situation" list), then picks among the
    rest at random, seeded by ``seed`` and the prompt (so the same agent in the same state
    with the same memory does the same thing). Reflection requests get a minimal
    schema answer, which makes reflection fall back to the rule derived from the trajectory.
    """

    capabilities = frozenset({"choices", "json_schema"})

    def __init__(self, *, seed: int = 0, lean: Mapping[str, float] = _LEAN) -> None:
        self.seed = seed
        self.lean = dict(lean)
        self.name = f"walker:{seed}"

    def complete(self, request: Request) -> Completion:
        if request.choices:
            text = self._choose(request)
        elif request.json_schema is not None:
            text = json.dumps(example_for_schema(request.json_schema))
        else:
            text = "Keep going."
        prompt = sum(count_words(m.content) for m in request.messages)
        return Completion(text=text, prompt_tokens=prompt, completion_tokens=count_words(text), model=self.name)

    def _choose(self, request: Request) -> str:
        from forge.envs.situation import summarize_observation
        from forge.learn import rules

        user = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
        situation = summarize_observation(user)
        options = list(request.choices or ())
        banned = rules.forbidden_in((m.content for m in request.messages), situation, options)
        banned |= _flagged_here(user, options)
        allowed = [c for c in options if c not in banned] or options
        rng = random.Random(f"{self.seed}|{user}")
        return rng.choices(allowed, weights=[self.lean.get(o, 1.0) for o in allowed])[0]

    def count_tokens(self, text: str) -> int:
        return count_words(text)

    def close(self) -> None:
        return None
