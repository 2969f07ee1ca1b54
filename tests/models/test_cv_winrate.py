"""The reward-model side of control-variates evaluation: BT loss, orientation, the HF path, the winrate command."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning import Trainer

from zoo.cli import main
from zoo.models.cv_winrate import MLPScorer, PairwiseRewardModel, bradley_terry_loss, preference_probability


def test_bradley_terry_loss_is_minus_log_sigmoid_of_chosen_minus_rejected() -> None:
    """Check that the loss equals mean −log σ(r_chosen − r_rejected) over non-tie pairs, whichever side won."""
    delta = torch.tensor([1.5, -0.5, 2.0, 0.2])
    z = torch.tensor([1.0, 1.0, 0.0, 0.5])
    chosen_minus_rejected = torch.tensor([1.5, -0.5, -2.0])
    expected = -torch.nn.functional.logsigmoid(chosen_minus_rejected).mean()
    torch.testing.assert_close(bradley_terry_loss(delta, z), expected)


def test_bradley_terry_loss_of_all_ties_is_zero_with_a_graph() -> None:
    """Check that a batch of ties gives a zero loss that still backpropagates (no NaN from an empty mean)."""
    delta = torch.randn(3, requires_grad=True)
    loss = bradley_terry_loss(delta, torch.full((3,), 0.5))
    loss.backward()
    assert float(loss) == 0.0 and torch.equal(delta.grad, torch.zeros(3))


def test_preference_probability_flips_when_responses_are_swapped() -> None:
    """Check the orientation: ẑ(A over B) = 1 − ẑ(B over A), so flipping a pair flips z and ẑ together."""
    scorer = MLPScorer(dim=4)
    x, a, b = torch.randn(6, 4), torch.randn(6, 4), torch.randn(6, 4)
    torch.testing.assert_close(preference_probability(scorer, x, a, b), 1 - preference_probability(scorer, x, b, a))


def test_mlp_scorer_rejects_wrong_feature_width() -> None:
    """Check that features of the wrong width get one error naming both shapes and the setting to change."""
    with pytest.raises(ValueError, match=r"shape \(N, 8\), got \(3, 5\).*model.dim"):
        MLPScorer(dim=8)(torch.randn(3, 5), torch.randn(3, 5))


def _tiny_hf_reward_model(folder: Path) -> Path:
    """A randomly initialised one-layer BERT reward model and a word-level tokenizer, saved offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "the", "answer", "is", "yes", "no", "maybe", "why", "what", "?", "."]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(words),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        num_labels=1,
    )
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder


def test_hf_reward_model_scores_text_pairs_and_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Check the real path: a Hugging Face reward model by folder gives ẑ in (0, 1) and takes Bradley–Terry steps."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = PairwiseRewardModel(scorer="hf", hf_model=str(_tiny_hf_reward_model(tmp_path / "rm")), max_length=32)
    batch = {
        "prompt": ["what is the answer ?", "why ?"],
        "a": ["the answer is yes .", "maybe ."],
        "b": ["no .", "the answer is no ."],
        "z": torch.tensor([1.0, 0.0]),
    }
    z_hat = model(batch)
    assert z_hat.shape == (2,) and bool(((z_hat > 0) & (z_hat < 1)).all())
    swapped = model({**batch, "a": batch["b"], "b": batch["a"]})
    torch.testing.assert_close(swapped, 1 - z_hat, atol=1e-6, rtol=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        loss = bradley_terry_loss(model.reward_gap(batch), batch["z"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]


def test_reward_model_needs_a_name_for_the_hf_scorer() -> None:
    """Check that scorer='hf' without hf_model is refused with the fix in the message."""
    with pytest.raises(ValueError, match="needs hf_model"):
        PairwiseRewardModel(scorer="hf")


def test_reward_model_fit_raises_held_out_saving_over_its_start() -> None:
    """Check that Bradley–Terry training on the arena (LLM 0 held out) gives ẑ that correlate with human labels."""
    from zoo.datamodules.preferences import PreferenceDataModule

    torch.manual_seed(0)
    dm = PreferenceDataModule(holdout_llm=0, seed=0)
    model = PairwiseRewardModel(dim=8)
    trainer = Trainer(
        max_epochs=6, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
    )
    before = trainer.test(model, datamodule=dm, verbose=False)[0]
    trainer.fit(model, datamodule=dm)
    after = trainer.test(model, datamodule=dm, verbose=False)[0]
    assert after["test/rho"] > 0.2 and after["test/saving"] > before["test/saving"] + 0.05
    assert after["test/accuracy"] > 0.6


def test_winrate_command_prints_estimate_interval_and_saving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Check that `zoo winrate FILE` reads a CSV with missing human labels and prints the CV estimate and saving."""
    g = torch.Generator().manual_seed(0)
    u = torch.randn(400, generator=g)
    z = (u + 0.5 * torch.randn(400, generator=g) > 0).float()
    z_hat = torch.sigmoid(2 * u)
    rows = ["human,synthetic"] + [
        f"{'' if i % 4 else int(z[i])},{float(z_hat[i]):.4f}"
        for i in range(400)  # a quarter labelled
    ]
    path = tmp_path / "feedback.csv"
    path.write_text("\n".join(rows) + "\n")
    main(["winrate", str(path)])
    out = capsys.readouterr().out
    assert "100 human labels of 400 pairs" in out
    assert "control variates : win rate" in out and "interval" in out and "save" in out


def test_winrate_command_refuses_labels_outside_0_half_1(tmp_path: Path) -> None:
    """Check that a human label of 2 stops `zoo winrate` with one message naming the bad value."""
    path = tmp_path / "bad.csv"
    path.write_text("human,synthetic\n1,0.7\n2,0.4\n0,0.2\n")
    with pytest.raises(SystemExit, match="zoo winrate: .*2"):
        main(["winrate", str(path)])


def test_winrate_command_names_missing_file(tmp_path: Path) -> None:
    """Check that a missing feedback file says which columns to provide."""
    with pytest.raises(SystemExit, match="No feedback file .* columns 'human'"):
        main(["winrate", str(tmp_path / "none.csv")])


def test_winrate_of_nan_synthetic_scores_is_refused(tmp_path: Path) -> None:
    """Check that a NaN synthetic score is refused rather than silently poisoning the estimate."""
    path = tmp_path / "nan.csv"
    path.write_text("human,synthetic\n1,0.7\n0,nan\n0,0.2\n1,0.9\n")
    with pytest.raises(SystemExit, match="zoo winrate: .*(NaN|nan)"):
        main(["winrate", str(path)])


def test_winrate_command_refuses_an_empty_or_header_only_file(tmp_path: Path) -> None:
    """Check that an empty file and a header alone stop `zoo winrate` with one line naming the file."""
    for name, text in (("empty.csv", ""), ("header.csv", "human,synthetic\n"), ("empty.jsonl", "\n")):
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(SystemExit, match=f"zoo winrate: {path} holds no comparisons"):
            main(["winrate", str(path)])


def test_winrate_command_warns_when_the_interval_cannot_be_trusted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Check that three equal labels (se 0) and two labels (normal interval beyond [0, 1]) print a warning line, and
    that the interval is clipped to [0, 1]."""
    equal = tmp_path / "equal.csv"
    equal.write_text("human,synthetic\n1,0.7\n1,0.6\n1,0.9\n,0.4\n")
    with pytest.warns(UserWarning, match="all 3 human labels are equal"):
        main(["winrate", str(equal)])
    assert capsys.readouterr().out.startswith("warning: all 3 human labels are equal")
    two = tmp_path / "two.csv"
    two.write_text("human,synthetic\n1,0.7\n0,0.3\n,0.5\n,0.6\n")
    with pytest.warns(UserWarning, match="only 2 human labels"):
        main(["winrate", str(two)])
    out = capsys.readouterr().out
    assert "warning: only 2 human labels" in out and "interval [0.0000, 1.0000]" in out


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scorer": "MLP"}, "`scorer` to be one of 'mlp', 'hf', but got 'MLP'"),
        ({"lr": -1.0}, "`lr` to be a finite float > 0, but got -1.0"),
        ({"num_llms": 1}, "`num_llms` to be an int >= 2, but got 1"),
        ({"weight_decay": -0.1}, "`weight_decay` to be a finite float >= 0"),
    ],
)
def test_reward_model_refuses_impossible_arguments(kwargs: dict, message: str) -> None:
    """Check that impossible constructor arguments are refused in __init__ with the accepted values named."""
    with pytest.raises(ValueError, match=message):
        PairwiseRewardModel(**kwargs)


def test_preference_datamodule_refuses_impossible_arguments() -> None:
    """Check the DataModule's argument checks: fractions outside [0, 1), a negative held-out LLM, an unknown source."""
    from zoo.datamodules.preferences import PreferenceDataModule

    with pytest.raises(ValueError, match=r"`val_fraction` to be a finite float in \[0, 1\), but got 1.5"):
        PreferenceDataModule(val_fraction=1.5)
    with pytest.raises(ValueError, match="`holdout_llm` to be an int >= 0 or None, but got -1"):
        PreferenceDataModule(holdout_llm=-1)
    with pytest.raises(ValueError, match="`source` to be one of 'arena', 'jsonl', 'parquet', but got 'csv'"):
        PreferenceDataModule(source="csv")


# --- the stand-in estimators of the reproduction ----------------------------------------------------------------------


def test_stratified_sampling_allocates_labels_in_proportion_and_its_exact_variance_matches_its_draws() -> None:
    """Check stratified sampling: each stratum gets n·N_h/N labels (largest remainders), the weights sum to 1, the
    estimate is unbiased, and the closed-form variance matches the variance of 20,000 simulated draws (with and
    without replacement) within 5 %."""
    from zoo.models.cv_winrate.alternatives import stratified_estimates, stratified_indices, stratified_variance

    g = torch.Generator().manual_seed(0)
    scores = torch.rand(103, generator=g, dtype=torch.float64)
    z = (torch.rand(103, generator=g, dtype=torch.float64) < scores).double()
    # N = 10 in 3 strata: bounds round(0, 3.33, 6.67, 10) = (0, 3, 7, 10), sizes (3, 4, 3); n = 7: shares
    # (2.1, 2.8, 2.1), floors (2, 2, 2), the one label left to the largest remainder (0.8): counts (2, 3, 2)
    index, weight = stratified_indices(torch.arange(10.0).flip(0), n=7, reps=4, strata=3, generator=g)
    assert index.shape == (4, 7) and float(weight.sum()) == pytest.approx(1.0)
    strata_of = torch.tensor([2, 2, 2, 1, 1, 1, 1, 0, 0, 0])  # scores 9..0: the lowest three form stratum 0
    assert strata_of[index].sort(dim=1).values.tolist() == [[0, 0, 1, 1, 1, 2, 2]] * 4
    assert weight.tolist() == pytest.approx([0.15, 0.15, 4 / 30, 4 / 30, 4 / 30, 0.15, 0.15])  # W_h / m_h
    for replace in (True, False):
        index, weight = stratified_indices(scores, n=12, reps=20_000, strata=5, replace=replace, generator=g)
        est = stratified_estimates(z, index, weight)
        assert float(est.mean()) == pytest.approx(float(z.mean()), abs=0.004)
        exact = stratified_variance(z, scores, n=12, strata=5, replace=replace)
        assert float(est.var()) == pytest.approx(exact, rel=0.05)


def test_stratified_sampling_refuses_impossible_arguments() -> None:
    """Check that fewer labels than strata, and more labels than a stratum holds without replacement, are refused."""
    from zoo.models.cv_winrate.alternatives import stratified_indices

    with pytest.raises(ValueError, match="`n` to be an int >= 5, but got 3"):
        stratified_indices(torch.rand(50), n=3, reps=2, strata=5)
    with pytest.raises(ValueError, match="use replace=True"):
        stratified_indices(torch.rand(10), n=12, reps=2, strata=5, replace=False)
    with pytest.raises(ValueError, match="`strata` to be an int >= 1, but got 0"):
        stratified_indices(torch.rand(10), n=10, reps=2, strata=0)


def test_isotonic_recalibration_is_monotone_and_stays_in_unit_range() -> None:
    """Check that the recalibrated scores never decrease with the raw score and stay in [0, 1]."""
    from zoo.models.cv_winrate.alternatives import isotonic_recalibration

    g = torch.Generator().manual_seed(1)
    raw = torch.rand(500, generator=g)
    labels = (torch.rand(500, generator=g) < raw**3).double()
    f = isotonic_recalibration(raw, labels)
    grid = torch.linspace(-0.5, 1.5, 101)
    out = f(grid)
    assert bool((out.diff() >= 0).all()) and float(out.min()) >= 0.0 and float(out.max()) <= 1.0


def test_calibrated_link_of_the_simulation_has_slope_one() -> None:
    """Check simulate_feedback(link="calibrated"): within each decile of ẑ the mean label equals the mean score
    (E[z | ẑ] = ẑ, so α* ≈ 1), where the logistic score is off by up to 0.25."""
    from zoo.models.cv_winrate.experiment import pool_stats, simulate_feedback

    for link, worst in (("calibrated", 0.015), ("logistic", None)):
        z, z_hat = simulate_feedback(100_000, 1.2, seed=0, link=link)
        deciles = torch.bucketize(z_hat, torch.quantile(z_hat, torch.linspace(0, 1, 11, dtype=z_hat.dtype))[1:-1])
        gap = max(abs(float(z[deciles == d].mean() - z_hat[deciles == d].mean())) for d in range(10))
        if worst is None:
            assert gap > 0.2
        else:
            assert gap < worst and pool_stats(z, z_hat)[1] == pytest.approx(1.0, abs=0.03)
