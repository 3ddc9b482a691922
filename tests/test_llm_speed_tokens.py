"""bench/llm_speed.py's count of new prompt tokens per decision (issue 51): what LlamaCppLLM
would evaluate, from the KV cache's last prompt and saved states of static prefixes."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from llm_speed import _episodes_requests, evaluated_tokens  # noqa: E402


def test_the_kv_cache_keeps_the_shared_head_and_the_last_token_is_always_read():
    static = list(range(40))
    a = (static + [100, 101, 102], 40)
    b = (static + [100, 200], 40)  # shares 41 tokens with a
    assert evaluated_tokens([a, b]) == [43, 1]
    assert evaluated_tokens([a, a]) == [43, 1]  # an identical prompt: only its last token


def test_a_static_prefix_seen_before_is_restored_after_another_prompt_took_the_cache():
    static = list(range(40))
    other = ([7] * 50, 0)  # a reflection, say: no shared head, no state of its own
    first, again = (static + [100, 101], 40), (static + [300, 301, 302], 40)
    assert evaluated_tokens([first, other, again]) == [42, 50, 3]
    short = (list(range(10)) + [1, 2], 10)  # under 32 static tokens: no saved state
    assert evaluated_tokens([short, other, short]) == [12, 50, 12]


class _Words:
    def count_tokens(self, text: str) -> int:
        return len(text.split())


def test_the_recorded_requests_are_the_flat_policys_actor_prompts():
    requests, source = _episodes_requests("frozenlake-random-4x4", _Words(), episodes=2, steps=4, seed=0)
    assert source == "the env itself" and 2 <= len(requests) <= 8
    assert all(r.choices and r.messages[0].role == "system" for r in requests)
    requests, source = _episodes_requests("cyborg-cage2", _Words(), episodes=1, steps=3, seed=0)
    assert len(requests) == 3 and len(requests[0].choices) == 145
