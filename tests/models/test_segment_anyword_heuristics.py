"""The non-learned grounding heuristics and the shared-colour / textured scenes, against hand-drawn cases."""

from __future__ import annotations

import pytest
import torch

from zoo.datamodules.shapes import PALETTE, captioned_shapes
from zoo.models.segment_anyword.heuristics import (
    colour_component,
    colour_match,
    random_component,
    shape_template,
    texture_component,
)

RED, BLUE = torch.tensor(PALETTE["red"]), torch.tensor(PALETTE["blue"])


def _scene() -> torch.Tensor:
    """A 12 x 12 grey image: a red 5 x 5 square at rows/cols 1-5, a red radius-2 circle (the 5 x 5 box without its
    four corners, dx² + dy² <= 6) centred at (8, 8), and one blue pixel at (10, 1)."""
    image = torch.zeros(3, 12, 12)
    image[:, 1:6, 1:6] = RED[:, None, None]
    for dy in range(-2, 3):
        for dx in range(-2, 3):
            if dx * dx + dy * dy <= 6:
                image[:, 8 + dy, 8 + dx] = RED
    image[:, 10, 1] = BLUE
    return image


def test_colour_match_takes_every_pixel_of_the_colour() -> None:
    image = _scene()
    assert int(colour_match(image, "red").sum()) == 25 + 21  # both red objects, whatever the shape word
    assert colour_match(image, "blue").nonzero().tolist() == [[10, 1]]
    with pytest.raises(ValueError, match="unknown colour"):
        colour_match(image, "purple")


def test_colour_component_keeps_the_larger_object_of_the_colour() -> None:
    mask = colour_component(_scene(), "red")
    assert int(mask.sum()) == 25 and bool(mask[1:6, 1:6].all())  # the square (25 px) beats the circle (21 px)


def test_shape_template_picks_the_component_that_fits_the_named_shape() -> None:
    image = _scene()
    circle, square = shape_template(image, "red", "circle"), shape_template(image, "red", "square")
    assert int(circle.sum()) == 21 and bool(circle[8, 8]) and not bool(circle[6, 6])  # the corner-less blob
    assert int(square.sum()) == 25 and bool(square[1, 1])
    assert not shape_template(image, "green", "circle").any()  # no pixel of the colour: an empty mask


def test_texture_component_reads_the_stripes() -> None:
    """Two red 4 x 4 blocks, one in horizontal stripes (rows alternate +-0.2: a circle's texture), one in vertical
    stripes (a square's): the circle's word picks the first, the square's the second, whatever their sizes."""
    image = torch.zeros(3, 12, 12)
    image[:, 1:5, 1:5] = RED[:, None, None] + 0.2 * torch.tensor([1.0, -1.0, 1.0, -1.0])[None, :, None]
    image[:, 6:11, 6:11] = RED[:, None, None] + 0.2 * torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0])[None, None, :]
    circle, square = texture_component(image, "red", "circle"), texture_component(image, "red", "square")
    assert int(circle.sum()) == 16 and bool(circle[1, 1])
    assert int(square.sum()) == 25 and bool(square[6, 6])


def test_random_component_returns_one_whole_object() -> None:
    image = _scene()
    sizes = {int(random_component(image, generator=torch.Generator().manual_seed(s)).sum()) for s in range(20)}
    assert sizes == {25, 21, 1}  # each of the three components, each whole


def test_shared_colour_scenes_paint_every_object_in_one_colour_and_name_two_shapes() -> None:
    data = captioned_shapes(40, seed=3, hard_fraction=0.25, shared_colour_fraction=0.5)
    shared, hard = data["shared_colour"], data["hard"]
    assert int(shared.sum()) == 20 and int(hard.sum()) == 10 and not bool((shared & hard).any())
    for i in shared.nonzero()[:, 0].tolist():
        words = data["caption"][i].split()
        colours = {w for w in words if w in PALETTE}
        assert len(colours) == 1, data["caption"][i]  # every named object in the one colour
        present = data["masks"][i].flatten(1).any(1)
        assert int(present.sum()) >= 2  # a second object of the colour is always there
        colour = torch.tensor(PALETTE[colours.pop()])
        for j in present.nonzero()[:, 0].tolist():  # unnamed objects too: the mean pixel is the colour
            assert torch.allclose(data["image"][i][:, data["masks"][i, j]].mean(1), colour, atol=0.05)
        if len(words) > 3:  # two phrases: two different shape words
            shapes = [w for w in words if w in ("circle", "square", "triangle")]
            assert len(set(shapes)) == 2


def test_textured_scenes_stripe_circles_by_row_squares_by_column_triangles_in_a_checkerboard() -> None:
    data = captioned_shapes(60, seed=1, textured=True)
    rows, cols = torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij")
    pattern = {0: 1 - 2 * (rows % 2), 1: 1 - 2 * (cols % 2), 2: (1 - 2 * (rows % 2)) * (1 - 2 * (cols % 2))}
    seen = set()
    flat = captioned_shapes(60, seed=1)  # the same scenes without texture (same draws)
    for i in range(60):
        for j in range(3):
            mask = data["masks"][i, j]
            if not mask.any():
                continue
            shape = (
                ["circle", "square", "triangle"].index(data["caption"][i].split()[2])
                if j == data["phrase_object"][i, 0]
                else None
            )
            if shape is None:
                continue
            # textured minus flat, on the object, is exactly +-0.2 in the shape's pattern (the noise is the same
            # draw) wherever neither image was clamped to [-1, 1]
            diff = (data["image"][i] - flat["image"][i])[:, mask]
            expected = (0.2 * pattern[shape][mask].float()).expand_as(diff)
            unclamped = (data["image"][i].abs() < 1)[:, mask] & (flat["image"][i].abs() < 1)[:, mask]
            assert int(unclamped.sum()) > 0.5 * unclamped.numel()
            assert torch.allclose(diff[unclamped], expected[unclamped], atol=1e-5), (i, j)
            seen.add(shape)
    assert seen == {0, 1, 2}


def test_experiment_scores_every_arm_on_the_same_scenes() -> None:
    """Every arm of the reproduction runs on a tiny model; a heuristic arm's masks are the heuristic's own, and an
    arm's subset metrics are those of its masks against the named objects (checked for colour_match by hand)."""
    from zoo.metrics.grounding import mask_iou
    from zoo.models.segment_anyword import SegmentAnyword
    from zoo.models.segment_anyword.experiment import ARMS, METRICS, Experiment

    torch.manual_seed(0)
    model = SegmentAnyword(block_out_channels=[8, 16], tuning_steps=1, inversion_steps=2)
    experiment = Experiment(model, 6, ARMS)
    results = {arm: experiment(arm, 0) for arm in ARMS}
    assert all(set(METRICS) <= set(r) for r in results.values())
    data = experiment.scenes_of(0)
    ious = []
    for i in range(6):
        masks = experiment.masks("colour_match", i, 0)
        words = data["caption"][i].split()
        for k, mask in enumerate(masks):
            assert torch.equal(
                mask, colour_match(data["image"][i], words[1 + 4 * k if " and " in data["caption"][i] else 1 + 5 * k])
            )
            ious.append(float(mask_iou(mask[None], data["masks"][i, int(data["phrase_object"][i, k])][None])[0]))
    assert results["colour_match"]["giou"] == pytest.approx(sum(ious) / len(ious), abs=1e-6)
    shared = [iou for iou, i in zip(ious, [i for i in range(6) for _ in experiment.masks("colour_match", i, 0)])
              if bool(data["shared_colour"][i])]  # fmt: skip
    assert results["colour_match"]["shared_giou"] == pytest.approx(sum(shared) / len(shared), abs=1e-6)
    # each map setting is the pipeline's own maps with that setting's switches, on the scene's seeded generator
    phrases, tokens = experiment.targets[0]
    positions = model.pipeline().flat_positions(tokens)
    direct = {
        "raw": model.pipeline(mode="raw", tuning_steps=0),
        "untuned": model.pipeline(tuning_steps=0),
        "raw_tuned": model.pipeline(mode="raw"),
    }
    for setting, pipe in direct.items():
        expected = pipe.attention_maps(data["image"][0], data["tokens"][0], positions, torch.Generator().manual_seed(0))
        assert torch.allclose(experiment.maps[setting][0], expected), setting
    with pytest.raises(ValueError, match="unknown arms"):
        Experiment(model, 2, ("full", "sam"))
