"""C³R: the regulariser's terms and their gradients, the counterfactual, the instrument, the plug-in's interface
check, the host module on its DataModule, the real features path through the conf, and the reproduction's claims."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning import Trainer
from torch import nn

from zoo.datamodules.multimodal import MultiModalDataModule, write_features
from zoo.models.c3 import C3Classifier, C3Regularized, C3Regularizer, counterfactual, counterfactual_risks
from zoo.module import ZooModule


def _inputs(n: int = 6, d: int = 8, seed: int = 0) -> tuple[list[nn.Module], list[torch.Tensor], torch.Tensor]:
    torch.manual_seed(seed)
    encoders = [nn.Linear(5, d), nn.Linear(7, d)]
    features = [encoders[0](torch.randn(n, 5)), encoders[1](torch.randn(n, 7))]
    return encoders, features, torch.randint(0, 3, (n,))


def test_every_term_trains_the_encoders() -> None:
    """Check that L_nec, L_IV and L_fe each give the modality encoders a non-zero gradient (the released code's terms
    carry none: a detached Z, no create_graph, argmax indicators; card §8). A term is isolated as the difference of
    two regulariser losses on the same graph, with and without its weight."""
    encoders, features, y = _inputs()
    head = nn.Linear(8, 3)
    z = features[0] + features[1]

    def loss(lambda_v: float, lambda_fe: float) -> torch.Tensor:
        return C3Regularizer(8, lambda_v=lambda_v, lambda_fe=lambda_fe, sufficiency=False)(features, z, head, y)[0]

    torch.manual_seed(0)
    terms = {"nec": loss(0.0, 0.0), "iv": loss(1.0, 0.0) - loss(0.0, 0.0), "fe": loss(0.0, 1.0) - loss(0.0, 0.0)}
    params = [p for e in encoders for p in e.parameters()]
    for name, term in terms.items():
        grads = torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
        assert all(g is not None and g.abs().sum() > 0 for g in grads), name


def test_counterfactual_removes_or_adds_the_evidence_per_sample() -> None:
    """Check that the evidence-removing step lowers p_y and the vt code's sign raises it, that gradients are per
    sample (a sample's z̄ is the same alone or in a batch), and the relative step has length η‖Z‖."""
    torch.manual_seed(0)
    head, z, y = nn.Linear(4, 3), torch.randn(10, 4), torch.randint(0, 3, (10,))
    p = F.softmax(head(z), -1).gather(1, y[:, None])
    removed = F.softmax(head(counterfactual(z, head, y, 0.1)), -1).gather(1, y[:, None])
    added = F.softmax(head(counterfactual(z, head, y, 0.1, sign="code_vt")), -1).gather(1, y[:, None])
    assert (removed < p).all() and (added > p).all()
    torch.testing.assert_close(counterfactual(z[:1], head, y[:1]), counterfactual(z, head, y)[:1])
    step = counterfactual(z, head, y, 0.25, eta_mode="relative") - z
    torch.testing.assert_close(step.norm(dim=-1), 0.25 * z.norm(dim=-1))
    with pytest.raises(ValueError, match="sign must be"):
        counterfactual(z, head, y, sign="add")


def test_iv_loss_is_kl_of_the_instrument_to_the_representation() -> None:
    """Check L_IV = KL(softmax(V) ‖ softmax(Z)) (card §8: F.kl_div(log q, p) is KL(p ‖ q)) for 2 and 3 modalities."""
    for m in (2, 3):
        torch.manual_seed(m)
        reg = C3Regularizer(8, num_modalities=m)
        features = [torch.randn(5, 8) for _ in range(m)]
        z = torch.randn(5, 8)
        v = reg.instrument(features)
        p, q = F.softmax(v, -1), F.softmax(z, -1)
        expected = (p * (p.log() - q.log())).sum(-1).mean()
        _, metrics = reg(features, z, nn.Linear(8, 3), torch.zeros(5, dtype=torch.long))
        torch.testing.assert_close(metrics["loss_iv"], expected)
        assert v.shape == (5, 8)


def test_regularizer_weight_zero_and_bad_input() -> None:
    _, features, y = _inputs()
    z = features[0] + features[1]
    loss, _ = C3Regularizer(8, weight=0.0)(features, z, nn.Linear(8, 3), y)
    assert float(loss) == 0.0
    with pytest.raises(ValueError, match="share the batch size"):
        C3Regularizer(8)([features[0], features[1][:4]], z, nn.Linear(8, 3), y)
    with pytest.raises(ValueError, match="at least two modalities"):
        C3Regularizer(8, num_modalities=1)
    with pytest.raises(ValueError, match=r"\(B, 8\)"):
        C3Regularizer(8)(features, torch.randn(6, 4), nn.Linear(4, 3), y)


def test_counterfactual_risks_are_indicator_metrics() -> None:
    """Check R_C3 = risk_suff + risk_nec, and that a confident linear head needs a large step to flip."""
    head = nn.Linear(2, 2)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[10.0, 0.0], [0.0, 10.0]]))
        head.bias.zero_()
    z, y = torch.tensor([[1.0, 0.0], [0.0, 1.0]]), torch.tensor([0, 1])
    small = counterfactual_risks(z, head, y, 1e-4)
    assert small["risk_suff"] == 0 and small["risk_nec"] == 1 and small["c3_risk"] == 1
    assert counterfactual_risks(z, head, y, 2.0, "relative")["risk_nec"] == 0


# -- the plug-in and the host --------------------------------------------------------------------------------------
def test_plug_in_checks_the_host_interface_at_setup() -> None:
    class NoHead(C3Regularized, ZooModule):
        def __init__(self) -> None:
            super().__init__()
            self.c3 = C3Regularizer(8)

    with pytest.raises(TypeError, match=r"needs `NoHead.head`"):
        NoHead().setup("fit")

    class WrongC3(C3Regularized, ZooModule):
        def __init__(self) -> None:
            super().__init__()
            self.head, self.c3 = nn.Linear(8, 3), nn.Linear(8, 8)

    with pytest.raises(TypeError, match=r"needs `WrongC3.c3`, a C3Regularizer"):
        WrongC3().setup("fit")


def test_host_rejects_modalities_of_different_batch_sizes() -> None:
    model = C3Classifier()
    with pytest.raises(ValueError, match="different batch sizes"):
        model({"a": torch.randn(4, 32), "b": torch.randn(3, 32)})
    with pytest.raises(KeyError, match="no modality"):
        model({"a": torch.randn(4, 32)})


def test_host_trains_with_c3_and_logs_every_test_condition(tmp_path: Path) -> None:
    dm = MultiModalDataModule(n_train=256, n_val=64, n_test=128, batch_size=64)
    model = C3Classifier()
    trainer = Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=tmp_path)  # fmt: skip
    trainer.fit(model, dm)
    assert {"train/loss_nec", "train/c3_risk", "train/loss_iv"} <= set(trainer.logged_metrics)
    metrics = trainer.test(model, dm, verbose=False)
    merged = {k: v for m in metrics for k, v in m.items()}
    expected = {f"test/acc_{n}" for n in dm.test_names} | {"test/acc_noise_avg", "test/acc_noise_worst"}
    assert expected <= set(merged)
    assert merged["test/acc_noise_worst"] <= merged["test/acc_noise_avg"] <= 1


def test_features_files_train_through_the_conf(tmp_path: Path) -> None:
    """The real path a user takes: three modalities of paired features (as open_clip embeddings would be) written
    with ``write_features``, through ``conf/c3.yaml``; the test noise goes to a named modality."""
    from zoo.hub import conf_path
    from zoo.lightning_cli import ZooCLI

    rng = np.random.default_rng(0)
    for split, n in (("train", 96), ("val", 32), ("test", 48)):
        labels = rng.integers(0, 3, n)
        feats = {"image": rng.normal(size=(n, 12)) + labels[:, None], "text": rng.normal(size=(n, 6)),
                 "audio": rng.normal(size=(n, 4))}  # fmt: skip
        write_features(tmp_path, split, feats, labels)
    cli = ZooCLI(
        args=["-c", str(conf_path("c3")), "--data.init_args.source", "features", "--data.init_args.data_dir",
              str(tmp_path), "--data.init_args.noise_modality", "image", "--data.init_args.batch_size", "32",
              "--model.init_args.modalities", "[audio, image, text]", "--model.init_args.input_dims", "[4, 12, 6]",
              "--trainer.max_epochs", "8", "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
              "--trainer.callbacks", "[]", "--trainer.enable_progress_bar", "false",
              "--trainer.default_root_dir", str(tmp_path)],
        run=False,
    )  # fmt: skip
    cli.trainer.fit(cli.model, cli.datamodule)
    merged = {k: v for m in cli.trainer.test(cli.model, cli.datamodule, verbose=False) for k, v in m.items()}
    assert {"test/acc_test", "test/acc_noise_worst"} <= set(merged)
    assert merged["test/acc_test"] > 0.5


# -- the reproduction's claims --------------------------------------------------------------------------------------
def test_reproduction_claims_reject_their_stand_ins() -> None:
    """Check on made-up results shaped like the calibration that each claim fails for every stand-in in its place,
    and that a regulariser that changes nothing (the baseline's numbers) fails the asserted ones."""
    from zoo.claims import evaluate
    from zoo.models.c3.reproduce import CLAIMS

    rows = {  # acc_id, acc_anti, acc_noise_worst, c3_risk_relative
        "c3": (0.90, 0.38, 0.80, 0.2), "baseline": (0.91, 0.34, 0.74, 0.97), "zero_weight": (0.91, 0.34, 0.74, 0.97),
        "l2": (0.33, 0.33, 0.33, 0.7),
    }  # fmt: skip
    r = {f"{arm}/{k}": v for arm, row in rows.items()
         for k, v in zip(("acc_id", "acc_anti", "acc_noise_worst", "c3_risk_relative"), row)}  # fmt: skip
    out = evaluate(r, CLAIMS)
    for claim in CLAIMS:
        assert out[f"{claim.prefix}/{claim.name}"] == 1.0, claim.name
        assert all(out[f"rejects/{claim.name}/{arm}"] == 1.0 for arm in claim.stand_ins), claim.name
    assert {c.name for c in CLAIMS if not c.asserted} == {"c3_anti_correlated_accuracy_above_baseline_by_0.03"}
    for key in ("acc_id", "acc_anti", "acc_noise_worst", "c3_risk_relative"):
        r[f"c3/{key}"] = r[f"l2/{key}"] if key == "acc_id" else r[f"baseline/{key}"]
    out = evaluate(r, CLAIMS)
    assert all(out[f"claims/{c.name}"] == 0.0 for c in CLAIMS if c.asserted)
