"""Speed of generation (chapter "The 2026 block").

Prints ``NAME ratio=R target>=T`` lines, each measured against a peer in the same run:

* ``generate_cache_speedup``: tokens per second of ``d2lmini.generate`` with the key/value cache
  divided by the same greedy decoding without it (the whole prefix recomputed each step), 256 new
  tokens after a 16-token prompt, on a 2026-block language model of width 256 (4 blocks, 8 heads
  sharing 2 key/value heads). Both decode the same tokens (checked).
* ``generate_vs_hf``: ``d2lmini.generate``'s cached greedy tokens per second divided by Hugging
  Face ``transformers``' ``generate(do_sample=False)`` on the same model converted by
  ``d2lmini.reference.to_hf`` (``Qwen3ForCausalLM``), same prompt and length; both give the same
  tokens (checked).

The capstone's training is measured by ``bench_train.py`` (``train_mfu_09``).

Times are CPU time of this process (``time.process_time``), which other programs on the machine
do not inflate; the header names the machine and its load.

Run: ``python benchmarks/bench_generate.py``.
"""

from __future__ import annotations

import argparse
import time

import torch

from bench_train import load_average, processor_name
from d2lmini import LanguageModel, generate, num_parameters
from d2lmini.data import python_reference_corpus
from d2lmini.reference import to_hf
from d2lmini.seeding import seeded

BENCH_MODEL = dict(num_hiddens=256, num_heads=8, num_kv_heads=2, qk_norm="per_head", positions="rope")
PROMPT_LEN, NEW_TOKENS, NUM_BLOCKS = 16, 256, 4


def cpu_seconds(fn, repeats: int = 3) -> float:
    """The least CPU time of ``repeats`` calls of ``fn`` (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def bench_generation(vocab_size: int) -> None:
    with seeded(0):
        model = LanguageModel(vocab_size, NUM_BLOCKS, PROMPT_LEN + NEW_TOKENS, **BENCH_MODEL).eval()
        prompt = torch.randint(0, vocab_size, (1, PROMPT_LEN))
    cached = generate(model, prompt, NEW_TOKENS)
    assert torch.equal(cached, generate(model, prompt, NEW_TOKENS, use_cache=False))
    with_cache = cpu_seconds(lambda: generate(model, prompt, NEW_TOKENS))
    without = cpu_seconds(lambda: generate(model, prompt, NEW_TOKENS, use_cache=False), repeats=1)
    print(f"# {num_parameters(model):,} parameters; {NEW_TOKENS} tokens: {NEW_TOKENS / with_cache:.0f} tokens/s "
          f"with the cache, {NEW_TOKENS / without:.0f} without", flush=True)
    print(f"generate_cache_speedup ratio={without / with_cache:.2f} target>=5", flush=True)

    hf = to_hf(model)
    kwargs = dict(max_new_tokens=NEW_TOKENS, do_sample=False, attention_mask=torch.ones_like(prompt), pad_token_id=0)
    assert torch.equal(hf.generate(prompt, **kwargs), cached)
    theirs = cpu_seconds(lambda: hf.generate(prompt, **kwargs))
    print(f"# transformers' generate on {type(hf).__name__}: {NEW_TOKENS / theirs:.0f} tokens/s", flush=True)
    print(f"generate_vs_hf ratio={theirs / with_cache:.2f} target>=1.0", flush=True)


def main() -> None:
    torch.set_num_threads(1)  # as the book runs
    print(f"# {processor_name()}; torch {torch.__version__}, 1 thread; load average {load_average()}", flush=True)
    corpus = python_reference_corpus()
    bench_generation(corpus.vocab_size)
    print(f"# load average at the end {load_average()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    main()
