"""Structured output: tolerant JSON parsing, validation, repair by re-asking, constrained choice."""

from __future__ import annotations

import json

import pytest

from forge.errors import LLMError, UserError
from forge.llm import Message, StructuredOutputError, choose, complete_json
from forge.llm.structured import match_option, parse_json_lenient, validate_json
from forge.llm.testing import ScriptedLLM

RULE = {
    "type": "object",
    "properties": {
        "rule": {"type": "string", "minLength": 3},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
        "kind": {"enum": ["rule", "lesson"]},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["rule", "confidence"],
}


# --- parse_json_lenient ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ("  [1, 2]  ", [1, 2]),
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('Sure! Here it is:\n```\n{"a": [1, 2]}\n```\nHope that helps.', {"a": [1, 2]}),
        ('The answer is {"a": "x}y"} as requested.', {"a": "x}y"}),
        ('{"a": 1, "b": [1, 2,],}', {"a": 1, "b": [1, 2]}),
        ("{'a': 'it\\'s', 'b': True, 'c': None}", {"a": "it's", "b": True, "c": None}),
        ('{"say": "don\'t, ok"}', {"say": "don't, ok"}),
        ("I don't know {'a': 1}", {"a": 1}),
        ('noise {not json} then {"a": 2}', {"a": 2}),
        ('{"a": "True, None"}', {"a": "True, None"}),
        ('"just a string"', "just a string"),
    ],
)
def test_parse_json_lenient_recovers_what_the_model_meant(text, expected):
    assert parse_json_lenient(text) == expected


def test_parse_json_prefers_the_opener_the_schema_asks_for():
    text = 'items [1, 2] in {"a": 1}'
    assert parse_json_lenient(text, prefer="{") == {"a": 1}
    assert parse_json_lenient(text, prefer="[") == [1, 2]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("no json here", "no JSON"),
        ('{"a": [1, 2', "cut off"),
        ("{a: b: c}", "could not be parsed"),
    ],
)
def test_parse_json_lenient_says_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        parse_json_lenient(text)


# --- validate_json -----------------------------------------------------------------------------


def test_validate_accepts_a_good_value():
    assert (
        validate_json({"rule": "do x", "confidence": 0.5, "kind": "rule", "tags": []}, RULE) == []
    )


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({"confidence": 0.5}, "missing required field 'rule'"),
        ({"rule": 3, "confidence": 0.5}, "$.rule: expected string, got integer"),
        ({"rule": "ab", "confidence": 0.5}, "at least 3 characters"),
        ({"rule": "abc", "confidence": 2}, "$.confidence: must be <= 1"),
        ({"rule": "abc", "confidence": True}, "expected number, got boolean"),
        (
            {"rule": "abc", "confidence": 0.1, "kind": "fact"},
            '"fact" is not one of "rule", "lesson"',
        ),
        ({"rule": "abc", "confidence": 0.1, "tags": ["a", 1]}, "$.tags[1]: expected string"),
        ([1], "$: expected object, got array"),
    ],
)
def test_validate_reports_each_problem_with_a_path(value, fragment):
    problems = validate_json(value, RULE)
    assert any(fragment in p for p in problems), problems


def test_validate_integer_bool_and_additional_properties():
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "additionalProperties": False,
    }
    assert validate_json({"n": 3}, schema) == []
    assert validate_json({"n": 3.0}, schema) == []
    assert validate_json({"n": 3.5}, schema) != []
    assert validate_json({"n": False}, schema) != []
    assert validate_json({"n": 1, "x": 2}, schema) == ["$: unexpected field 'x'"]
    assert validate_json(None, {"type": ["string", "null"]}) == []
    assert validate_json(1, {"anyOf": [{"type": "string"}, {"type": "integer"}]}) == []
    assert validate_json(1.5, {"anyOf": [{"type": "string"}, {"type": "integer"}]}) != []


# --- complete_json -----------------------------------------------------------------------------


def test_complete_json_parses_a_sloppy_reply_first_time():
    llm = ScriptedLLM(["Here you go:\n```json\n{'rule': 'close doors', 'confidence': 0.9,}\n```"])
    assert complete_json(llm, "make a rule", schema=RULE) == {
        "rule": "close doors",
        "confidence": 0.9,
    }
    assert llm.calls == 1
    prompt = llm.last_request.messages[-1].content
    assert prompt.startswith("make a rule") and '"required":["rule","confidence"]' in prompt
    assert llm.last_request.json_schema is None  # no native capability -> not sent


def test_complete_json_sends_schema_natively_when_the_backend_can():
    llm = ScriptedLLM(capabilities={"json_schema"})  # obeys: returns a schema example
    value = complete_json(llm, [Message("user", "x")], schema=RULE)
    assert validate_json(value, RULE) == []
    assert llm.last_request.json_schema == RULE


def test_complete_json_reasks_with_the_error_then_succeeds():
    llm = ScriptedLLM(['{"rule": "ok"}', "{'rule': 'fine rule', 'confidence': 1}"])
    assert complete_json(llm, "go", schema=RULE, retries=2) == {
        "rule": "fine rule",
        "confidence": 1,
    }
    assert llm.calls == 2
    second = llm.requests[1].messages
    assert second[-2] == Message("assistant", '{"rule": "ok"}')
    assert "missing required field 'confidence'" in second[-1].content
    assert "at least 3 characters" in second[-1].content


def test_complete_json_gives_up_with_the_last_raw_reply():
    llm = ScriptedLLM(["nope", "still nope", "never"])
    with pytest.raises(StructuredOutputError) as info:
        complete_json(llm, "go", schema=RULE, retries=2)
    assert isinstance(info.value, LLMError)
    assert info.value.raw == "never"
    assert info.value.attempts == 3 and len(info.value.errors) == 3
    assert "scripted gave no valid JSON after 3 attempts" in str(info.value)
    assert llm.calls == 3


@pytest.mark.parametrize("schema", [
    {"type": "string", "enum": []},
    {"type": "object", "properties": {"avoid": {"type": "string", "enum": []}}},
    {"type": "array", "items": {"type": "object", "properties": {"x": {"enum": []}}}},
])
def test_a_schema_no_value_can_match_is_refused_before_the_model_is_asked(schema):
    """llama.cpp's grammar for an empty alternative is invalid, and the process died with no
    traceback (a reflection on a lost TextWorld game, whose last state has no actions)."""
    llm = ScriptedLLM(['"anything"'])
    with pytest.raises(StructuredOutputError, match="empty enum"):
        complete_json(llm, "go", schema=schema)
    assert llm.calls == 0


def test_complete_json_retries_zero_means_one_attempt():
    llm = ScriptedLLM(["nope", '{"rule": "abc", "confidence": 0}'])
    with pytest.raises(StructuredOutputError):
        complete_json(llm, "go", schema=RULE, retries=0)
    assert llm.calls == 1


def test_complete_json_lets_backend_errors_through():
    llm = ScriptedLLM([LLMError("server down")])
    with pytest.raises(LLMError, match="server down"):
        complete_json(llm, "go", schema=RULE)


def test_complete_json_array_schema():
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 1}
    llm = ScriptedLLM(["Numbers: [3, 1, 2]"])
    assert complete_json(llm, "go", schema=schema) == [3, 1, 2]


# --- choose ------------------------------------------------------------------------------------

OPTIONS = ["go north", "go", "open door", "Wait"]


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("go", "go"),
        ("  open door\n", "open door"),
        ('"Wait".', "Wait"),
        ("wait", "Wait"),
        ("OPEN DOOR", "open door"),
        ("I think we should go north now.", "go north"),
        ("Let's go, then wait", "go"),
        ("Action: open door", "open door"),
        ("opn door", "open door"),
        ("- Wait\nbecause it is safest", "Wait"),
        ("banana", None),
        ("xyzzy", None),
    ],
)
def test_match_option(reply, expected):
    assert match_option(reply, OPTIONS) == expected


def test_choose_matches_a_chatty_reply():
    llm = ScriptedLLM(["I would open door."])
    assert choose(llm, "what now?", OPTIONS) == "open door"
    request = llm.last_request
    assert request.choices is None
    assert "- go north\n- go\n- open door\n- Wait" in request.messages[-1].content


def test_choose_uses_native_choices_when_advertised():
    llm = ScriptedLLM(["  WAIT "], capabilities={"choices"})
    assert choose(llm, "what now?", OPTIONS) == "Wait"
    assert list(llm.last_request.choices) == OPTIONS
    assert llm.last_request.max_tokens == 2 * 2 + 4  # longest option: 2 words


def test_choose_retries_then_raises():
    llm = ScriptedLLM(["banana", "apple", "cherry"], capabilities={"choices"})
    with pytest.raises(StructuredOutputError) as info:
        choose(llm, "what now?", OPTIONS, retries=2)
    assert info.value.raw == "cherry" and llm.calls == 3
    assert "not one of the options" in llm.requests[1].messages[-1].content


def test_choose_retries_then_succeeds():
    llm = ScriptedLLM(["banana", "go north"])
    assert choose(llm, "what now?", OPTIONS) == "go north"
    assert llm.calls == 2


def test_choose_fallback():
    llm = ScriptedLLM(["banana"], repeat_last=True)
    assert choose(llm, "what now?", OPTIONS, retries=1, fallback="Wait") == "Wait"
    assert llm.calls == 2


@pytest.mark.parametrize("options", [[], ["a", ""], ["a", "a"], ["a", 3]])
def test_choose_rejects_bad_options(options):
    with pytest.raises(UserError):
        choose(ScriptedLLM(), "x", options)


def test_default_scripted_reply_obeys_constraints():
    llm = ScriptedLLM()
    assert choose(llm, "x", ["b", "a"]) == "b"
    value = complete_json(llm, "x", schema=RULE)
    assert json.loads(json.dumps(value)) == value and validate_json(value, RULE) == []
