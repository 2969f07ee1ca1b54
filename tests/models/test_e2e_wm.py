"""e2e-wm: the method's parts (encoder, MGDA, Gumbel mixing, noise layer), the baselines, SynLang, detection errors,
and the real path on a tiny randomly initialised GPT-2 with its own tokenizer."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch

from zoo.datamodules.synlang import BOS, SynLang, SynLangDataModule
from zoo.models.e2e_wm import (
    E2EWatermark,
    EXPWatermark,
    KGWWatermark,
    PerturbationEncoder,
    UnigramWatermark,
    WatermarkDecoder,
    detection_metrics,
    mgda_two_task,
)
from zoo.models.e2e_wm.generation import (
    differentiable_generate,
    gumbel_mix,
    soft_synonym_swap,
)
from zoo.models.e2e_wm.lm import GRULM
from zoo.models.e2e_wm.watermarks import green_lists


def test_mgda_branches_and_cap():
    d, s = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    assert float(mgda_two_task(d, s, cap=None)) == pytest.approx(0.5)  # min-norm point of two orthogonal unit vectors
    assert float(mgda_two_task(d, 2 * d, cap=None)) == 1.0  # d·s ≥ d·d
    assert float(mgda_two_task(2 * s, s, cap=None)) == 0.0  # d·s ≥ s·s
    assert float(mgda_two_task(d, s)) == pytest.approx(0.01)  # the official cap
    g_d, g_s = torch.randn(5), torch.randn(5)
    a = mgda_two_task(g_d, g_s, cap=None)
    grid = torch.linspace(0, 1, 1001)
    norms = ((grid[:, None] * g_d + (1 - grid[:, None]) * g_s) ** 2).sum(-1)
    assert float(a) == pytest.approx(float(grid[norms.argmin()]), abs=2e-3)  # it is the min-norm combination


def test_encoder_perturbs_only_top_k_by_a_centred_sign():
    torch.manual_seed(0)
    enc = PerturbationEncoder(dim=8, window=4, top_k=6, delta=1.5, sharpness=1e6)
    logits, E = torch.randn(1, 40), torch.randn(40, 8)  # batch size 1 (the official squeeze() broke it)
    out = enc(logits, E[torch.randint(0, 40, (1, 3))], E)
    diff = out - logits
    top = logits.topk(6).indices[0]
    outside = torch.ones(40, dtype=torch.bool)
    outside[top] = False
    assert bool((diff[0, outside] == 0).all())
    assert torch.allclose(diff[0, top].abs(), torch.full((6,), 1.5), atol=1e-3)
    assert 0 < int((diff[0, top] > 0).sum()) < 6  # centred: some candidates green, some red
    with pytest.raises(ValueError, match="context"):
        enc(logits, E[torch.randint(0, 40, (1, 2))], E)
    with pytest.raises(ValueError, match="embedding table"):
        enc(torch.randn(1, 41), E[torch.randint(0, 40, (1, 3))], E)


def test_decoder_reads_the_last_valid_token():
    dec = WatermarkDecoder(dim=4, hidden=8)
    x = torch.randn(2, 6, 4)
    padded = x.clone()
    padded[1, 3:] = 100.0  # padding after length 3 must not matter
    full = dec(x[1:, :3])
    assert torch.allclose(dec(padded, torch.tensor([6, 3]))[1], full[0], atol=1e-5)


def test_gumbel_mix_and_gradients_reach_the_encoder_only_through_its_own_step():
    torch.manual_seed(0)
    lm = GRULM(20, embed_dim=8, hidden=16).eval()
    for p in lm.parameters():
        p.requires_grad_(False)
    enc = PerturbationEncoder(dim=8, window=3, top_k=4, delta=1.0)
    prompts = lm.embedding[torch.randint(0, 20, (3, 4))]
    mixes = differentiable_generate(lm, prompts, 5, lambda l, c: enc(l, c, lm.embedding), window=3, tau=0.5)
    assert mixes.shape == (3, 5, 20)
    assert torch.allclose(mixes.sum(-1), torch.ones(3, 5))
    assert bool((mixes.max(-1).values >= 0.5).all())  # the hard half
    mixes.pow(2).sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in enc.parameters())
    assert all(p.grad is None for p in lm.parameters())
    m = gumbel_mix(torch.zeros(2, 5), 0.1, hard_weight=1.0)
    assert bool(((m == 0) | (m == 1)).all())


def test_soft_synonym_swap_keeps_meaning_and_mass():
    lang = SynLang()
    x = torch.nn.functional.one_hot(lang.sample(4, 9)[:, 1:], lang.vocab_size).float()
    y = soft_synonym_swap(x, lang.synonym_average(), p=1.0)
    C = lang.membership()
    assert torch.allclose(y @ C, x @ C) and torch.allclose(y.sum(-1), torch.ones(4, 8))
    assert torch.allclose(y.max(-1).values, torch.full((4, 8), 0.25))


def test_synlang_attack_nll_and_text():
    lang = SynLang()
    g = torch.Generator().manual_seed(0)
    x = lang.sample(50, 20, g)
    assert bool((x[:, 0] == BOS).all()) and int(x[:, 1:].min()) >= 2
    swapped = lang.swap_synonyms(x, 1.0, g)
    assert bool((lang.class_of(swapped) == lang.class_of(x)).all())
    assert bool((swapped[:, 1:] != x[:, 1:]).all())  # a *different* synonym
    assert 0.25 < float((lang.swap_synonyms(x, 0.3, g)[:, 1:] != x[:, 1:]).float().mean()) < 0.35
    nll = lang.nll(x)
    assert nll.shape == (50, 19) and bool(torch.isfinite(nll).all())
    assert abs(float(lang.nll(lang.sample(4000, 40, g))[:, 5:].mean()) - lang.entropy_rate()) < 0.05
    with pytest.raises(ValueError, match="did you mean"):
        lang.from_text("w00a w0b")
    with pytest.raises(ValueError, match="empty"):
        lang.from_text("   ")
    with pytest.raises(ValueError, match="another tokenizer"):
        lang.class_of(torch.tensor([[500]]))


def test_kgw_and_unigram_lists_and_z_scores():
    g = green_lists(3, torch.tensor([0, 1, 0]), 98, 0.5)
    assert g.sum(-1).tolist() == [49, 49, 49] and torch.equal(g[0], g[2]) and not torch.equal(g[0], g[1])
    assert not torch.equal(g[0], green_lists(4, torch.tensor([0]), 98, 0.5)[0])  # the key matters
    uniform = torch.randint(2, 98, (400, 48), generator=torch.Generator().manual_seed(1))
    for cls in (KGWWatermark, UnigramWatermark):
        wm = cls(98, delta=3.0, key=7)
        z = wm.score(uniform)
        assert abs(float(z.mean())) < 0.25 and 0.7 < float(z.std()) < 1.3  # ≈ N(0, 1) on unwatermarked i.i.d. text
        ids = uniform[:, :1]
        for _ in range(47):
            probs = wm(ids, torch.zeros(len(ids), 98)).softmax(-1)
            ids = torch.cat([ids, torch.multinomial(probs, 1)], 1)
        assert float(wm.score(ids).min()) > 3.0
        assert float(cls(98, delta=3.0, key=8).score(ids).abs().mean()) < 1.5  # another key sees nothing
        assert detection_metrics(wm.score(ids), z)["auc"] > 0.99
        with pytest.raises(ValueError, match="another tokenizer"):
            wm.score(torch.tensor([[3, 200]]))


@pytest.fixture(scope="module")
def toy() -> E2EWatermark:
    return E2EWatermark(lm="e2e-wm-lm")


def test_frozen_lm_is_not_in_the_weights_and_round_trips(toy, tmp_path):
    keys = toy.state_dict().keys()
    assert not any(k.startswith("frozen_lm.") for k in keys) and any(k.startswith("encoder.") for k in keys)
    from zoo import hub

    eval_len = toy.hparams.eval_len
    toy.calibrate(torch.randint(2, 98, (100, eval_len), generator=torch.Generator().manual_seed(0)))
    assert toy.null_scores.shape == (eval_len, 512) and not bool(toy.null_scores.isnan().any())
    hub.write_entry(toy, tmp_path / "wm", zoo_meta={"name": "e2e-wm"}, card_text="# test\n")
    back = E2EWatermark.from_pretrained(str(tmp_path / "wm"))
    assert torch.equal(back.null_scores, toy.null_scores)  # the per-length null travels with the weights
    ids, lengths = torch.randint(2, 98, (3, 10)), torch.tensor([10, 4, 1])
    assert torch.allclose(back.score(ids), toy.score(ids))
    scores = toy.score(ids, lengths)
    assert torch.allclose(back.score(ids, lengths), scores)
    assert torch.equal(back.p_value(scores, lengths), toy.p_value(scores, lengths))


def test_detection_errors(toy):
    fresh = E2EWatermark(lm="e2e-wm-lm")
    with pytest.raises(RuntimeError, match="calibrate"):
        fresh.detect(["w00a w01b"])
    with pytest.raises(RuntimeError, match="calibrate"):
        fresh.p_value(torch.zeros(1), torch.ones(1, dtype=torch.long))
    fresh.calibrate(torch.randint(2, 98, (100, fresh.hparams.eval_len)))
    with pytest.raises(ValueError, match="empty"):
        fresh.detect([""])
    with pytest.raises(ValueError, match="not a SynLang word"):
        fresh.detect(["the cat sat"])
    with pytest.raises(ValueError, match="another tokenizer"):
        fresh.score(torch.tensor([[5, 50257]]))
    out = fresh.detect(["w00a w01b w02c", "w05a"], fpr=0.05)
    assert out["score"].shape == (2,) and bool(((out["p_value"] > 0) & (out["p_value"] <= 1)).all())
    assert out["length"].tolist() == [3, 1] and torch.equal(out["watermarked"], out["p_value"] <= 0.05)


def test_a_short_fit_learns_to_detect():
    """The card's smoke test, shortened: the decoder separates watermarked from unwatermarked text in training."""
    L.seed_everything(0)
    model = E2EWatermark(lr=3e-3, semantic_from=60, noise_from=90)
    # val_size ≥ 100: calibrate needs at least 100 human texts for the null (fewer leave it uncalibrated)
    dm = SynLangDataModule(seq_len=52, train_size=32 * 120, val_size=128, test_size=64, batch_size=32)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(model, dm)
    assert model.train_steps == 120
    assert trainer.callback_metrics["train/decoder_accuracy"] > 0.9
    assert trainer.callback_metrics["val/auc"] > 0.9
    assert model.null_scores.shape == (48, 512)  # one null per length up to eval_len
    assert not bool(model.null_scores.isnan().any())  # validation calibrated the p-values' null


def _tiny_hf(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "log", "sentence", "means", "in", "one", "word", "rewrite", "following", "text", "maintaining", "original", "meaning", "now", "start", "above", "user", "target", "rewritten", "this", ":", '"', ".", ",", "[", "]", "jockey", "riding", "horse", "equestrian"]  # fmt: skip
    vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(dict.fromkeys(words))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<unk>")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(vocab), n_positions=256, n_embd=16, n_layer=1, n_head=2))
    model.save_pretrained(tmp_path)
    fast.save_pretrained(tmp_path)
    return str(tmp_path), model, fast


def test_real_path_tiny_gpt2(tmp_path):
    """A Hugging Face causal LM by folder: online semantic loss, online paraphrase noise, MGDA, HF generate with
    every watermark as a logits processor, text detection in its tokenizer, and the vocabulary-mismatch errors."""
    path, hf, tok = _tiny_hf(tmp_path)
    L.seed_everything(0)
    model = E2EWatermark(lm=path, window=3, top_k=4, mapper_hidden=8, decoder_hidden=8, prompt_len=3, gen_len=4,
                         eval_len=5, paraphrase_len=4, semantic_from=0, noise_from=0, noise_prob=1.0)  # fmt: skip
    assert model.noise_kind == "paraphrase" and not model.is_synlang
    ids = torch.randint(1, len(tok), (4, 8))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4)
    val_ids = torch.randint(1, len(tok), (100, 8))  # validation calibrates the null: 100 human texts or more
    val_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(val_ids), batch_size=50)
    before = [p.clone() for p in model.encoder.parameters()]
    trainer = L.Trainer(max_steps=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)  # fmt: skip
    trainer.fit(model, loader, val_loader)
    assert "train/mgda_alpha" in trainer.callback_metrics and "val/auc" in trainer.callback_metrics
    assert model.null_scores.shape == (5, 512) and not bool(model.null_scores.isnan().any())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.encoder.parameters()))
    assert all(p.grad is None for p in hf.parameters())
    prompt = torch.tensor(tok("the cat sat on the")["input_ids"])[None]
    for proc in (model.logits_processor(), KGWWatermark(len(tok)), UnigramWatermark(len(tok))):
        out = model.frozen_lm.generate(prompt, max_new_tokens=6, do_sample=True, logits_processor=[proc],
                                       pad_token_id=0)  # fmt: skip
        assert out.shape == (1, prompt.shape[1] + 6)
    exp = EXPWatermark(len(tok), key=3)  # through HF generate: each token with a fresh context is EXP's choice
    out = model.frozen_lm.generate(prompt, max_new_tokens=6, do_sample=True, logits_processor=[exp], pad_token_id=0)
    with torch.no_grad():
        for t in range(prompt.shape[1], out.shape[1]):
            if not bool((out[0, : t - 1] == out[0, t - 1]).any()):
                logits = model.frozen_lm(out[:, :t]).logits[:, -1]
                assert int(exp(out[:, :t], logits).argmax()) == int(out[0, t])
    out = model.detect(["the cat sat on the mat", "a dog ran"])
    assert out["score"].shape == (2,) and out["length"].tolist() == [6, 3]  # 6 > eval_len: the 5-token null
    with pytest.raises(ValueError, match="trained with"):
        model.logits_processor()(prompt, torch.zeros(1, len(tok) + 3))
    with pytest.raises(ValueError, match="another tokenizer"):
        model.score(torch.tensor([[len(tok) + 5]]))
    with pytest.raises(ValueError, match="synonym"):
        E2EWatermark(lm=path, noise="synonym")


def test_document_path_tokenizes_and_filters(tmp_path):
    """The real-data path of SynLangDataModule: a .jsonl of documents read by a Hugging Face tokenizer folder."""
    path, _, tok = _tiny_hf(tmp_path / "lm")
    docs = ["the cat sat on the mat . the dog ran", "a dog", "the dog sat on a log , the cat ran on the mat"] * 4
    f = tmp_path / "docs.jsonl"
    f.write_text("\n".join(json.dumps({"text": d}) for d in docs))
    dm = SynLangDataModule(seq_len=6, val_size=2, test_size=2, batch_size=2, texts=str(f), tokenizer=path)
    dm.setup()
    rows = torch.cat([dm.train_set.tensors[0], dm.val_set.tensors[0], dm.test_set.tensors[0]])
    assert rows.shape == (8, 6)  # the 4 two-word documents are too short and dropped
    assert rows[0].tolist() == tok("the cat sat on the mat", add_special_tokens=False)["input_ids"]
    with pytest.raises(FileNotFoundError, match="one document per line"):
        SynLangDataModule(texts=str(tmp_path / "none.txt"), tokenizer=path).setup()
    with pytest.raises(ValueError, match="or neither"):
        SynLangDataModule(texts=str(f))


def test_cli_watermark_detect(tmp_path, capsys):
    from zoo.cli import main

    lang = SynLang()
    texts = [lang.to_text(row) for row in lang.sample(3, 12, torch.Generator().manual_seed(0))]
    f = tmp_path / "texts.jsonl"
    f.write_text("\n".join(json.dumps({"text": t}) for t in texts))
    main(["watermark", "detect", str(f), "--scheme", "kgw", "--key", "3"])
    out = capsys.readouterr().out
    assert '"key": 3' in out and "of 3 texts flagged" in out
    bad = tmp_path / "bad.txt"
    bad.write_text("hello world\n")
    with pytest.raises(SystemExit, match="not a SynLang word"):
        main(["watermark", "detect", str(bad), "--scheme", "kgw"])
    with pytest.raises(SystemExit, match="not found"):
        main(["watermark", "detect", str(tmp_path / "missing.txt")])
