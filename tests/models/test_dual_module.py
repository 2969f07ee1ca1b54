"""Tests of DUAL's classifier, its DataModule and the pruning workflow (the reproduction runs in the contract tests)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from lightning import Trainer

from zoo.callbacks import TrainingDynamics
from zoo.datamodules.images import random_crop_flip
from zoo.models.dual import DualClassifier
from zoo.models.dual.data import PrunableImageDataModule


def test_scoring_run_stops_at_T_with_the_long_schedule(tmp_path) -> None:
    """Check that the scoring run stops after T = 5 recorded epochs with the lr of a 200-epoch cosine at epoch 5."""
    dm = PrunableImageDataModule(batch_size=128)
    model = DualClassifier(lr=0.05, schedule_epochs=200)
    cb = TrainingDynamics(epochs=5, save_dir=str(tmp_path))
    trainer = Trainer(
        max_epochs=200,
        callbacks=[cb],
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, dm)
    steps = trainer.global_step
    assert trainer.current_epoch == 5 and cb.recorded_epochs == 5 and steps == 5 * math.ceil(1297 / 128)
    expected = 0.05 * 0.5 * (1 + math.cos(math.pi * steps / (200 * math.ceil(1297 / 128))))
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(expected, rel=1e-6)
    assert not torch.isnan(cb.record()["target_probs"]).any()


def test_classifier_rejects_wrong_shapes_and_backbones() -> None:
    """Check that a wrong image shape and an unknown backbone raise clear errors, and the ResNet stem is CIFAR's."""
    model = DualClassifier()
    with pytest.raises(ValueError, match=r"expected images of shape \(B, 1, 8, 8\)"):
        model(torch.rand(2, 3, 8, 8))
    with pytest.raises(ValueError, match="unknown backbone"):
        DualClassifier(backbone="vgg")
    resnet = DualClassifier(backbone="resnet18_cifar", in_shape=[3, 32, 32])
    assert resnet.net.conv1.kernel_size == (3, 3) and resnet.net.conv1.stride == (1, 1)
    assert resnet(torch.rand(2, 3, 32, 32)).shape == (2, 10)


def test_datamodule_keeps_subsets_and_flips_labels(tmp_path) -> None:
    """Check kept subsets (list and .npy) keep full-set indices, and label noise flips that share to other classes."""
    clean = PrunableImageDataModule()
    clean.setup("fit")
    np.save(tmp_path / "keep.npy", np.array([3, 1, 7]))
    for keep in ([3, 1, 7], str(tmp_path / "keep.npy")):
        dm = PrunableImageDataModule(keep_indices=keep)
        dm.setup("fit")
        x, y, index = dm.train_set.__getitems__(range(3))
        assert index.tolist() == [1, 3, 7]
        torch.testing.assert_close(x, clean.train_set.x[[1, 3, 7]])
    noisy = PrunableImageDataModule(label_noise=0.2, noise_seed=1)
    noisy.setup("fit")
    changed = noisy.train_set.y != clean.train_set.y
    assert torch.equal(changed, noisy.noisy) and 0.15 < float(changed.float().mean()) < 0.25


def test_datamodule_bad_input_raises(tmp_path) -> None:
    """Check out-of-range, duplicate and missing keep_indices, bad noise, unknown datasets and missing CIFAR files."""
    with pytest.raises(ValueError, match="must index the 1297"):
        PrunableImageDataModule(keep_indices=[1297]).setup("fit")
    with pytest.raises(ValueError, match="duplicates"):
        PrunableImageDataModule(keep_indices=[1, 1]).setup("fit")
    with pytest.raises(FileNotFoundError, match="No index file"):
        PrunableImageDataModule(keep_indices=str(tmp_path / "none.npy")).setup("fit")
    np.save(tmp_path / "float.npy", np.array([3.7, 1.2]))
    with pytest.raises(
        ValueError,
        match=r"keep_indices file .*float\.npy must hold integer sample indices, got dtype float64",
    ):
        PrunableImageDataModule(keep_indices=str(tmp_path / "float.npy")).setup("fit")
    with pytest.raises(ValueError, match="hard_cut"):
        PrunableImageDataModule(prune_ratio=0.5, prune_method="ccs", scores="auto", hard_cut=1.0)
    with pytest.raises(ValueError, match="label_noise"):
        PrunableImageDataModule(label_noise=1.0)
    with pytest.raises(ValueError, match="unknown dataset"):
        PrunableImageDataModule(dataset="mnist")
    with pytest.raises(FileNotFoundError, match="CIFAR10 is not in"):
        PrunableImageDataModule(dataset="cifar10", data_dir=str(tmp_path)).setup("fit")


def test_random_crop_flip_moves_pixels_within_the_padding() -> None:
    """Check that a crop of a padded image is a shift by at most the padding, possibly mirrored, with zero fill."""
    x = torch.arange(64.0).reshape(1, 1, 8, 8).expand(200, 1, 8, 8)
    out = random_crop_flip(x, padding=2, generator=torch.Generator().manual_seed(0))
    assert out.shape == x.shape
    values = out[out > 0]
    assert set(values.unique().tolist()) <= set(range(64))
    # Some crops are flipped (a row read right to left) and some are not.
    rows = out[:, 0, 4]
    increasing = (rows[:, 1:] >= rows[:, :-1]) | (rows[:, 1:] == 0) | (rows[:, :-1] == 0)
    assert 0 < int(increasing.all(1).sum()) < 200


def test_prune_ratio_with_auto_scores_keeps_half_and_skips_scoring_for_test() -> None:
    """Check that prune_ratio=0.5 with scores='auto' keeps 648 of 1297 samples and that a test setup does not prune."""
    dm = PrunableImageDataModule(prune_ratio=0.5, scores="auto")
    dm.setup("fit")
    assert len(dm.train_set) == 648 and len(dm.train_set.rows.unique()) == 648
    test_only = PrunableImageDataModule(prune_ratio=0.5, scores="auto")
    test_only.setup("test")
    assert len(test_only.train_set) == 1297  # no scoring run for evaluation


def test_pruning_workflow_from_a_recorded_dynamics_file(tmp_path) -> None:
    """Check score files: a dynamics.npz prunes with every method, a wrong-length file and bad arguments raise."""
    from zoo.models.dual.pruning import METHODS, load_record, prune_indices, score_run

    dm = PrunableImageDataModule()
    dm.setup("fit")
    record = score_run(dm.train_set.x, dm.train_set.y, epochs=12)
    np.savez(tmp_path / "dynamics.npz", **{k: v.numpy() for k, v in record.items()})
    loaded = load_record(tmp_path / "dynamics.npz", 1297)
    for method in METHODS:
        keep = prune_indices(method, 0.7, loaded, 1297, epochs=12)
        assert len(keep) == 389 and len(keep.unique()) == 389, method
    pruned = PrunableImageDataModule(
        prune_ratio=0.7,
        prune_method="dual",
        scores=str(tmp_path / "dynamics.npz"),
        score_epochs=12,
    )
    pruned.setup("fit")
    assert len(pruned.train_set) == 389
    # A 12-epoch record is not DUAL's T = 30 score: refused unless T is set to 12.
    with pytest.raises(ValueError, match="T = 30 recorded epochs and the record holds 12"):
        PrunableImageDataModule(prune_ratio=0.7, prune_method="dual", scores=str(tmp_path / "dynamics.npz")).setup(
            "fit"
        )
    # Logits saved where target probabilities belong are refused, not scored from −79 to 251.
    logits = {
        **{k: v.numpy() for k, v in record.items()},
        "target_probs": 40 * record["target_probs"].numpy() - 20,
    }
    np.savez(tmp_path / "logits.npz", **logits)
    with pytest.raises(ValueError, match=r"probabilities in \[0, 1\].*got values from -20"):
        prune_indices(
            "dual_beta",
            0.7,
            load_record(tmp_path / "logits.npz", 1297),
            1297,
            epochs=12,
        )
    np.save(tmp_path / "short.npy", np.zeros(10))
    with pytest.raises(ValueError, match="covers 10 samples but the training set has 1297"):
        PrunableImageDataModule(prune_ratio=0.5, prune_method="dual", scores=str(tmp_path / "short.npy")).setup("fit")
    with pytest.raises(ValueError, match="pruning ratio must be in"):
        PrunableImageDataModule(prune_ratio=1.0, scores="auto")
    with pytest.raises(ValueError, match="needs scores"):
        PrunableImageDataModule(prune_ratio=0.5, prune_method="dual")
    with pytest.raises(ValueError, match="not both"):
        PrunableImageDataModule(prune_ratio=0.5, scores="auto", keep_indices=[1])
    with pytest.raises(FileNotFoundError, match="No score file"):
        load_record(tmp_path / "none.npz", 1297)


def test_image_folder_path_serves_indexed_batches(tmp_path) -> None:
    """Check the ImageNet-style folder path: indexed 224-pixel training batches, kept subsets, clear missing-data error."""
    from PIL import Image

    for split in ("train", "val"):
        for label in ("cat", "dog"):
            (tmp_path / split / label).mkdir(parents=True)
            for i in range(3):
                Image.new("RGB", (40, 30), (40 * i, 100, 200)).save(tmp_path / split / label / f"{i}.png")
    dm = PrunableImageDataModule(
        dataset="imagefolder",
        data_dir=str(tmp_path),
        keep_indices=[0, 4, 5],
        batch_size=2,
    )
    dm.setup("fit")
    x, y, index = next(iter(dm.train_dataloader()))
    assert x.shape == (2, 3, 224, 224) and dm.num_classes == 2 and dm.num_train == 6
    assert set(index.tolist()) <= {0, 4, 5} and len(dm.train_set) == 3
    x_val, y_val = next(iter(dm.val_dataloader()))
    assert x_val.shape == (2, 3, 224, 224) and y_val.tolist() == [0, 0]
    with pytest.raises(FileNotFoundError, match="train/<class>/<image>"):
        PrunableImageDataModule(dataset="imagefolder", data_dir=str(tmp_path / "none")).setup("fit")


def test_callback_warns_when_samples_miss_their_record(tmp_path) -> None:
    """Check that an epoch that skips samples (limit_train_batches) warns that their record stays NaN."""
    cb = TrainingDynamics(epochs=1, save_dir=str(tmp_path))
    trainer = Trainer(
        max_epochs=1,
        limit_train_batches=3,
        callbacks=[cb],
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    with pytest.warns(UserWarning, match=r"1105 of 1297 samples got no record"):
        trainer.fit(DualClassifier(), PrunableImageDataModule(batch_size=64))


def test_batched_subset_training_equals_separate_runs() -> None:
    """Check that ``train_subsets`` (A MLPs in one loop) gives each subset the test logits of a separate ``sgd_fit``
    run with the same seed: the summed loss keeps the gradients apart and SGD acts elementwise."""
    from zoo.models.dual.experiment import train_subsets
    from zoo.models.dual.pruning import sgd_fit

    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(300, 1, 8, 8, generator=g), torch.randint(0, 10, (300,), generator=g)
    x_test, y_test = torch.rand(200, 1, 8, 8, generator=g), torch.randint(0, 10, (200,), generator=g)
    keep = torch.stack([torch.randperm(300, generator=g)[:70] for _ in range(3)])
    logits = train_subsets(x[keep], y[keep], x_test, y_test, epochs=6, batch_size=16, seed=3, logits=True)
    acc = train_subsets(x[keep], y[keep], x_test, y_test, epochs=6, batch_size=16, seed=3)
    for i in range(3):
        net, _ = sgd_fit(x[keep[i]], y[keep[i]], 6, batch_size=16, num_classes=10, seed=3)
        with torch.no_grad():
            expected = net(x_test)
        torch.testing.assert_close(logits[i], expected, rtol=1e-4, atol=1e-4)
        assert float(acc[i]) == float((expected.argmax(1) == y_test).double().mean())
    assert not torch.allclose(logits[0], logits[1])  # three different subsets, three different models


def test_reproduction_arms_select_k_and_only_the_method_matches_the_best_on_a_hand_grid() -> None:
    """Check every arm's selection on a synthetic record (k distinct indices; the stochastic ones reproducible), and
    that on a results grid where DUAL + β alone sits near the best baseline in every cell, only DUAL + β meets the
    "matches the best baseline everywhere" claim (each baseline is 10 behind the best where it is not best)."""
    from types import SimpleNamespace

    from zoo.models.dual.experiment import ARMS, BASELINES, RATIOS, SeedData, select
    from zoo.models.dual.reproduce import CLAIMS
    from zoo.models.dual.scores import keep_count

    g = torch.Generator().manual_seed(0)
    n = 300
    tp = torch.rand(30, n, generator=g)
    names = ("dual", "dual_no_unc", "el2n", "aum_30", "forgetting", "aum", "entropy", "dyn_unc", "tdds", "easy")
    scores = {name: torch.rand(n, generator=g, dtype=torch.float64) for name in names}
    dm = SimpleNamespace(train_set=SimpleNamespace(y=torch.randint(0, 10, (n,), generator=g)))
    data = SeedData(dm, scores, tp, tp, {})
    for arm in ARMS:
        for ratio in RATIOS:
            keep = select(arm, data, ratio, seed=3)
            assert len(keep) == keep_count(n, ratio) and len(keep.unique()) == len(keep), (arm, ratio)
            assert torch.equal(keep, select(arm, data, ratio, seed=3)), arm
    assert not torch.equal(
        select("beta_random", data, 0.7, 3).sort().values, select("dual_beta", data, 0.7, 3).sort().values
    )
    with pytest.raises(ValueError, match="unknown arm"):
        select("d2", data, 0.5, 0)
    # A grid by hand: in every cell one baseline is best at 90 and the others at 80, each baseline best in "its own"
    # cell (one of the nine is never best); DUAL + β sits at 89.5 everywhere (0.5 behind), every other arm at 70.
    cells = [(t, x) for t in ("clean", "noisy") for x in RATIOS]
    r = {}
    for i, (t, x) in enumerate(cells):
        best = BASELINES[i % len(BASELINES)]
        for arm in ARMS:
            r[f"{t}/{arm}/r{x}"] = 90.0 if arm == best else 80.0 if arm in BASELINES else 70.0
        r[f"{t}/dual_beta/r{x}"] = 89.5
    claim = next(c for c in CLAIMS if c.name == "dual_beta_matches_the_best_baseline_everywhere")
    assert claim.value_for(r, "dual_beta") == -0.5 and claim.meets(-0.5)
    for arm in claim.all_stand_ins:
        assert not claim.meets(claim.value_for(r, arm)), arm  # a baseline is 10 behind the best where it is not best


def test_scoring_loop_records_each_sample_at_its_index() -> None:
    """Check that ``score_run`` (the DataModule's "auto" scoring loop) writes each shuffled sample's softmax at its own
    index: with lr = 0 the weights stay at the seeded init, so every epoch's record is that net's softmax of x[i]."""
    from zoo.models.dual.module import build_backbone
    from zoo.models.dual.pruning import score_run

    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(150, 1, 8, 8, generator=g), torch.randint(0, 10, (150,), generator=g)
    record = score_run(x, y, epochs=3, lr=0.0, seed=4)
    torch.manual_seed(4)  # score_run seeds the init with its seed
    net = build_backbone("mlp", [1, 8, 8], 10)
    with torch.no_grad():
        probs = net(x).softmax(-1)
    for epoch in range(3):
        torch.testing.assert_close(record["probs"][epoch], probs)
        torch.testing.assert_close(record["target_probs"][epoch], probs[torch.arange(150), y])
