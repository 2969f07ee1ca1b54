"""Generated tokens/s with each watermark against plain generation: same LM, same batch.

    python tests/benchmarks/bench_e2e_wm.py [--repeats 7] [--threads 2]

The frozen hub LM ``e2e-wm-lm`` (1-layer GRU) samples 48 tokens after 4-token SynLang prompts for a batch of 500
rows through the zoo's batched sampler, plain and with each logits processor (E2E: the hub ``e2e-wm`` encoder;
KGW and Unigram at δ = 2); then a tiny randomly initialised GPT-2 (2 layers, 64 wide) through Hugging Face
``generate(logits_processor=[...])``, batch 32, 48 new tokens. Prints medians of ``--repeats`` runs.
"""

from __future__ import annotations

import argparse

import torch
from timing import (
    median_seconds,  # tests/benchmarks/timing.py (the script's folder is on sys.path)
)

import zoo
from zoo.models.e2e_wm import KGWWatermark, UnigramWatermark
from zoo.models.e2e_wm.generation import sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = zoo.load("e2e-wm")
    vocab = model.generator.embedding.shape[0]
    prompts = model.codec.sample(500, 5, torch.Generator().manual_seed(0))[:, 1:]
    procs = {"plain": [], "e2e": [model.logits_processor()], "kgw": [KGWWatermark(vocab, delta=2.0)],
             "unigram": [UnigramWatermark(vocab, delta=2.0)]}  # fmt: skip
    print(f"threads {args.threads}, medians of {args.repeats} runs; tokens/s (ratio to plain)")
    rates = {}
    for name, p in procs.items():
        s = median_seconds(lambda: sample(model.generator, prompts, 48, p, 1.0, torch.Generator().manual_seed(1)),
                           args.repeats)  # fmt: skip
        rates[name] = 500 * 48 / s
    print("GRU LM, batch 500:   " + ", ".join(f"{k} {v:,.0f} ({v / rates['plain']:.2f})" for k, v in rates.items()))

    from transformers import GPT2Config, GPT2LMHeadModel

    from zoo.models.e2e_wm.nets import PerturbationEncoder
    from zoo.models.e2e_wm.watermarks import E2ELogitsProcessor

    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=128, n_embd=64, n_layer=2, n_head=2)).eval()
    # An untrained encoder on the GPT-2's embedding table: the cost does not depend on its weights.
    e2e = E2ELogitsProcessor(PerturbationEncoder(64).eval(), hf.get_input_embeddings().weight)
    ids = torch.randint(0, 1000, (32, 4))
    hf_procs = {"plain": [], "e2e": [e2e], "kgw": [KGWWatermark(1000, delta=2.0)],
                "unigram": [UnigramWatermark(1000, delta=2.0)]}  # fmt: skip
    rates = {}
    for name, p in hf_procs.items():
        def run() -> None:
            with torch.no_grad():
                hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, min_new_tokens=48,
                            do_sample=True, logits_processor=p, pad_token_id=0)  # fmt: skip
        rates[name] = 32 * 48 / median_seconds(run, max(3, args.repeats // 2))
    print("GPT-2 (HF generate), batch 32: " + ", ".join(f"{k} {v:,.0f} ({v / rates['plain']:.2f})"
                                                        for k, v in rates.items()))  # fmt: skip


if __name__ == "__main__":
    main()
