"""Choices scored from logits, saved prefix states, and their counts in the ledger.

No real model: a fake language model whose next-token logits depend on what it has been fed
stands in for llama.cpp, so the token-trie walk can be checked call by call. The real SmolLM2
runs the same paths in test_llm_local.py.
"""

from __future__ import annotations

import random

import pytest

from forge.errors import UserError
from forge.llm import Completion, Message, MeteredLLM, Request, TokenLedger
from forge.llm.states import PrefixStates, PrefixStats, common_prefix
from forge.llm.structured import pick_by_logits
from forge.llm.testing import ScriptedLLM

END = 0
VOCAB = {"restore": 1, " User": 2, "1": 3, "2": 4, "remove": 5, "sleep": 6, "go": 7, " north": 8, "analyse": 9}


class FakeLM:
    """Logits as a function of the tokens fed after the prompt: ``table[context][token]``,
    every other token at -10. Records each ``extend`` call, as llama.cpp's eval would run."""

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], vocab: int = 16) -> None:
        self.table = table
        self.vocab = vocab
        self.context: list[int] = []
        self.calls: list[list[int]] = []

    def logits(self) -> list[float]:
        row = [-10.0] * self.vocab
        for token, value in self.table.get(tuple(self.context), {}).items():
            row[token] = value
        return row

    def extend(self, tokens):
        self.calls.append(list(tokens))
        self.context += list(tokens)
        return self.logits()


def _paths(*options: str) -> list[list[int]]:
    """Tokenize by the fake vocabulary (longest piece first)."""
    out = []
    for option in options:
        tokens, rest = [], option
        while rest:
            piece = max((p for p in VOCAB if rest.startswith(p)), key=len)
            tokens.append(VOCAB[piece])
            rest = rest[len(piece):]
        out.append(tokens)
    return out


def test_options_that_differ_in_their_first_token_cost_no_extra_evaluation():
    lm = FakeLM({(): {VOCAB["restore"]: 1.0, VOCAB["sleep"]: 3.0, VOCAB["analyse"]: 2.0}})
    options = ["restore User1", "sleep", "analyse"]
    pick = pick_by_logits(_paths(*options), lm.logits(), lm.extend, end=END)
    assert options[pick.index] == "sleep"
    assert lm.calls == [] and pick.evaluated == 0 and pick.evals == 0
    assert 0.5 < pick.p < 1.0  # softmax share of 3.0 against 1.0 and 2.0


def test_a_shared_prefix_is_walked_in_one_batch_then_decided_by_the_next_logits():
    # "restore" beats "remove" at the root; after "restore User", "2" beats "1".
    lm = FakeLM({
        (): {VOCAB["restore"]: 2.0, VOCAB["remove"]: 1.0},
        (VOCAB["restore"], VOCAB[" User"]): {VOCAB["1"]: 0.5, VOCAB["2"]: 1.5},
    })
    options = ["restore User1", "remove User1", "restore User2"]
    pick = pick_by_logits(_paths(*options), lm.logits(), lm.extend, end=END)
    assert options[pick.index] == "restore User2"
    # the chosen first token and the token every live option shares go in one call
    assert lm.calls == [[VOCAB["restore"], VOCAB[" User"]]]
    assert (pick.evaluated, pick.evals) == (2, 1)


def test_the_second_level_decides_against_a_first_level_that_would_mislead():
    """The trie walk reads the logits at the branch point, not the prompt's: with "1" ahead
    after "restore User" the pick flips, which a first-token-only scorer could not see."""
    lm = FakeLM({
        (): {VOCAB["restore"]: 2.0},
        (VOCAB["restore"], VOCAB[" User"]): {VOCAB["1"]: 4.0, VOCAB["2"]: 1.0},
    })
    options = ["restore User2", "restore User1"]
    assert options[pick_by_logits(_paths(*options), lm.logits(), lm.extend, end=END).index] == "restore User1"


def test_an_option_that_is_a_prefix_of_another_competes_with_the_end_token():
    paths = _paths("go", "go north")
    stop = FakeLM({(): {VOCAB["go"]: 1.0}, (VOCAB["go"],): {END: 2.0, VOCAB[" north"]: 1.0}})
    assert pick_by_logits(paths, stop.logits(), stop.extend, end=END).index == 0
    assert stop.calls == [[VOCAB["go"]]]
    walk = FakeLM({(): {VOCAB["go"]: 1.0}, (VOCAB["go"],): {END: 1.0, VOCAB[" north"]: 2.0}})
    assert pick_by_logits(paths, walk.logits(), walk.extend, end=END).index == 1


class RandomLM(FakeLM):
    """Random logits per context, remembered so a test can read what the walker saw."""

    def __init__(self, rng: random.Random) -> None:
        super().__init__({}, vocab=6)
        self.rng = rng
        self.seen: dict[tuple[int, ...], list[float]] = {}

    def logits(self) -> list[float]:
        key = tuple(self.context)
        if key not in self.seen:
            self.seen[key] = [self.rng.gauss(0, 3) for _ in range(self.vocab)]
        return self.seen[key]


def test_any_logits_give_a_valid_option():
    rng = random.Random(7)
    for _ in range(200):
        paths = {tuple(rng.randrange(1, 6) for _ in range(rng.randrange(1, 5))) for _ in range(rng.randrange(1, 12))}
        paths_list = [list(p) for p in paths]
        lm = RandomLM(rng)
        contexts = lm.seen
        pick = pick_by_logits(paths_list, lm.logits(), lm.extend, end=END)
        assert 0 <= pick.index < len(paths_list)
        # whatever was evaluated is a prefix of the chosen path
        fed = [t for call in lm.calls for t in call]
        assert fed == paths_list[pick.index][: len(fed)]
        # greedy: wherever the options still sharing the chosen prefix part, the chosen next
        # token (or the end) had the best logit among theirs, in that context
        chosen = paths_list[pick.index]
        for depth in range(len(chosen) + 1):
            live = [p for p in paths_list if p[:depth] == chosen[:depth]]
            if len(live) == 1:
                break
            nexts = {p[depth] if depth < len(p) else END for p in live}
            if len(nexts) > 1:
                row = contexts[tuple(chosen[:depth])]
                mine = chosen[depth] if depth < len(chosen) else END
                assert row[mine] == max(row[t] for t in nexts)
        assert 0.0 < pick.p <= 1.0


def test_sampling_at_a_temperature_is_reproducible_and_spreads():
    lm = FakeLM({(): {VOCAB["restore"]: 1.0, VOCAB["sleep"]: 1.0, VOCAB["analyse"]: 1.0}})
    paths = _paths("restore", "sleep", "analyse")
    picks = [pick_by_logits(paths, lm.logits(), lm.extend, end=END, temperature=1.0, seed=s).index for s in range(40)]
    assert picks == [pick_by_logits(paths, lm.logits(), lm.extend, end=END, temperature=1.0, seed=s).index for s in range(40)]
    assert set(picks) == {0, 1, 2}
    greedy = {pick_by_logits(paths, lm.logits(), lm.extend, end=END, seed=s).index for s in range(40)}
    assert len(greedy) == 1


def test_paths_must_be_distinct_and_non_empty():
    lm = FakeLM({})
    with pytest.raises(UserError):
        pick_by_logits([[1], [1]], lm.logits(), lm.extend, end=END)
    with pytest.raises(UserError):
        pick_by_logits([[1], []], lm.logits(), lm.extend, end=END)
    with pytest.raises(UserError):
        pick_by_logits([], lm.logits(), lm.extend, end=END)


# --- saved prefix states -----------------------------------------------------------------------


def test_common_prefix_matches_a_plain_loop():
    rng = random.Random(3)
    for _ in range(300):
        a = [rng.randrange(3) for _ in range(rng.randrange(0, 40))]
        b = a[: rng.randrange(0, len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 5))]
        naive = 0
        while naive < min(len(a), len(b)) and a[naive] == b[naive]:
            naive += 1
        assert common_prefix(a, b) == naive


def test_the_store_finds_the_longest_shared_prefix_for_its_own_model_only():
    states = PrefixStates(max_bytes=1000, max_entries=8)
    states.put("m", [1, 2, 3, 4], b"a" * 10)
    states.put("m", [1, 2, 9], b"b" * 10)
    states.put("other", [1, 2, 3, 4, 5], b"c" * 10)
    shared, saved, data = states.best("m", [1, 2, 3, 4, 5, 6])
    assert (shared, saved, data) == (4, (1, 2, 3, 4), b"a" * 10)
    assert states.best("m", [1, 2, 9, 9])[2] == b"b" * 10
    assert states.best("m", [1, 2, 3, 7])[:2] == (3, (1, 2, 3, 4))  # a partial match restores part
    assert states.best("m", [5, 6]) is None
    assert states.best("nobody", [1, 2]) is None


def test_the_store_stays_within_its_bounds_evicting_the_least_recently_used():
    states = PrefixStates(max_bytes=100, max_entries=3)
    for i in range(3):
        assert states.put("m", [i, i], bytes(30))
    states.best("m", [0, 0])  # 0 is now the most recently used
    assert states.put("m", [3, 3], bytes(30))  # 4 * 30 > 100: one goes, and it is 1
    assert len(states) == 3 and states.nbytes == 90 and states.evictions == 1
    assert states.best("m", [1, 1]) is None
    assert states.best("m", [0, 0]) is not None
    assert states.put("m", [4, 4], bytes(60))  # needs two out
    assert states.nbytes <= 100 and len(states) <= 3
    assert not states.put("m", [5], bytes(101))  # larger than the whole store
    assert states.best("m", [5]) is None
    for i in range(50):
        states.put("m", [i], bytes(i % 40))
        assert states.nbytes <= 100 and len(states) <= 3
    off = PrefixStates(max_bytes=0)
    assert not off.put("m", [1], b"x") and len(off) == 0


def test_prefix_stats_count_hits_and_misses():
    stats = PrefixStats()
    assert stats.hit_rate is None
    stats.count("evaluated", reused=0, evaluated=300)
    stats.count("restored", reused=290, evaluated=10)
    stats.count("kv", reused=295, evaluated=5)
    stats.count("partial", reused=100, evaluated=200)
    assert (stats.requests, stats.hits) == (4, 2)
    assert stats.hit_rate == 0.5
    assert stats.to_dict()["reused_tokens"] == 685 and stats.to_dict()["hit_rate"] == 0.5


# --- accounting ---------------------------------------------------------------------------------


def test_the_ledger_keeps_cached_tokens_and_the_prefix_hit_rate():
    replies = [
        Completion("a", 100, 1, meta={"prefix": "evaluated", "cached_tokens": 0}),
        Completion("b", 100, 1, meta={"prefix": "restored", "cached_tokens": 90}),
        Completion("c", 100, 1, meta={"prefix": "kv", "cached_tokens": 95}),
        Completion("d", 100, 1, meta={"prefix": "partial", "cached_tokens": 40}),
        Completion("e", 100, 1),  # a backend that says nothing about its prefix
    ]
    ledger = TokenLedger()
    metered = MeteredLLM(ScriptedLLM(replies), ledger, role="actor")
    for _ in replies:
        metered.complete(Request(messages=[Message("user", "x")]))
    usage = ledger.total(role="actor")
    assert usage.cached_tokens == 225
    assert (usage.prefix_hits, usage.prefix_misses) == (2, 2)
    assert usage.prefix_hit_rate == 0.5
    again = TokenLedger.from_dict(ledger.to_dict()).total()
    assert (again.cached_tokens, again.prefix_hits, again.prefix_misses) == (225, 2, 2)
    assert ledger.to_dict()["total"]["prefix_hit_rate"] == 0.5
    # a ledger written before these fields existed still merges
    old = {"groups": [{"tags": {"role": "actor"}, "calls": 1, "prompt_tokens": 5, "completion_tokens": 1}]}
    assert TokenLedger.from_dict(old).total().prefix_hit_rate is None
