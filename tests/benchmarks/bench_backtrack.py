"""Generated tokens/s of plain sampling and of backtracking on the hub's Dyck LM, with and without the KV cache, and
the cost of one next-token call against the prefix length.

    python tests/benchmarks/bench_backtrack.py [--rows 1200] [--repeats 5] [--threads 1]

Rows: the 300 shifted test prompts × 4 samples (``--rows``), completed to 26 tokens. "cached" is ``CachedLM`` (one
position per row per step); "recompute" wraps the same LM in ``FullSequenceLM`` (the whole prefix every step, as the
official batch-size-1 loop does). Backtracking uses the exact verifier (Q = 4, B = 4). Tokens/s counts the tokens in
the final completions; medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse

import torch
from timing import median_seconds  # tests/benchmarks/timing.py (the script's folder is on sys.path)

import zoo
from zoo.models.backtrack_sampling import CachedLM, FullSequenceLM, generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = zoo.load("backtrack-sampling")
    dm = zoo.datamodule("backtrack-sampling")
    dm.setup("test")
    tokens, lengths = (t.repeat_interleave(4, 0)[: args.rows] for t in dm.test_set.tensors)
    L = model.grammar.seq_len  # noqa: N806
    new_tokens = int((L - lengths).sum())
    lms = {"cached": lambda: CachedLM(model.lm), "recompute": lambda: FullSequenceLM(lambda t: model.lm(t)[0])}
    print(
        f"{args.rows} rows, {new_tokens} generated tokens per run, {args.threads} thread(s), median of {args.repeats}"
    )
    for name, make in lms.items():
        for method, verifier in (("plain", None), ("backtrack (exact)", model.exact_verifier)):

            def run() -> None:
                generate(make(), tokens, lengths, L, verifier, generator=torch.Generator().manual_seed(0))

            seconds = median_seconds(run, args.repeats)
            print(f"  {method:18s} {name:9s} {new_tokens / seconds:12,.0f} tokens/s")
    # One next-token call for every row at prefix length p: cached (after a cached prefix) vs recomputed.
    print("one next-token call for all rows, by prefix length (ms):")
    full = generate(CachedLM(model.lm), tokens, lengths, L, None, generator=torch.Generator().manual_seed(0)).tokens
    for p in (4, 8, 16, 24):
        cached = CachedLM(model.lm)
        cached(full, torch.full((len(full),), p - 1))  # prefill p − 1 tokens
        step = median_seconds(lambda: cached(full, torch.full((len(full),), p)), args.repeats)
        recompute = FullSequenceLM(lambda t: model.lm(t)[0])
        again = median_seconds(lambda: recompute(full, torch.full((len(full),), p)), args.repeats)
        print(f"  p = {p:2d}: cached {1000 * step:6.2f}   recompute {1000 * again:6.2f}")


if __name__ == "__main__":
    main()
