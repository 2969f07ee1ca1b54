"""Captioned coloured shapes for grounded segmentation (Segment Anyword): scenes, captions, tokens and object masks.

The embedded default is the Segment Anyword card's §6 toy at the size its review notes settle on: ``size`` × ``size``
RGB scenes (16 by default) on a grey background with small noise, holding 1–3 non-overlapping objects (a circle,
square or upright triangle, coloured red, green, blue or yellow, radius 2–4 px at 16 px, scaled with the size). Each
scene comes with a caption from a three-rule grammar that names one or two of its objects:

- ``"a <colour> <shape>"``;
- ``"a <colour> <shape> and a <colour> <shape>"``;
- ``"a <colour> <shape> left of a <colour> <shape>"`` (only when the first object's centre is left of the second's).

Objects the caption does not name are distractors. In an *easy* scene every object has its own shape, so the noun
alone picks the named object. In a *hard* scene the two named objects share a shape and differ in colour ("a red
circle and a blue circle"): only the colour word tells them apart, the case where raw noun attention fails (card §6).

The tokenizer is a fixed word list (:data:`VOCAB`): ``<bos>``, one token per word, ``<eos>``, then ``<pad>``, so word
i of a caption sits at token i + 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from zoo.datamodules.base import BatchedDataModule, DictBatches

__all__ = [
    "COLOURS",
    "MAX_TOKENS",
    "PALETTE",
    "SHAPES",
    "VOCAB",
    "CaptionedShapesDataModule",
    "ShapeTokenizer",
    "captioned_shapes",
]

COLOURS = ("red", "green", "blue", "yellow")
SHAPES = ("circle", "square", "triangle")  # the shape id of "phrase_class" is the index here
VOCAB = ("<pad>", "<bos>", "<eos>", "a", "and", "left", "of", *COLOURS, *SHAPES)
MAX_TOKENS = 10  # BOS + the 8 words of the longest caption ("a red circle left of a blue circle") + EOS
# RGB of each colour and of the background in the images' [-1, 1] range; kept within ±0.8 so the noise rarely clips.
PALETTE = {
    "red": (0.8, -0.7, -0.7),
    "green": (-0.7, 0.6, -0.7),
    "blue": (-0.7, -0.5, 0.8),
    "yellow": (0.8, 0.7, -0.7),
    "background": (0.0, 0.0, 0.0),
}
NOISE_STD = 0.05  # Gaussian pixel noise on the whole image, in [-1, 1] units
TEXTURE_AMPLITUDE = 0.2  # textured scenes: each shape's ±1 pattern, times this, added to its colour
_OBJECTS = 3  # object slots per scene (absent objects have empty masks)
_SEED_STRIDE = 1000  # split seeds of CaptionedShapesDataModule: 1000 · seed + k
_SEED_OFFSETS = {"train": 0, "val": 1, "test": 2}


def _textures(size: int) -> Tensor:
    """The ±1 pattern of each shape ``(3, S, S)``: circles in horizontal stripes, squares in vertical stripes,
    triangles in a checkerboard (one-pixel period, in image coordinates)."""
    pos = torch.arange(size)
    rows = (1.0 - 2.0 * (pos % 2)).view(-1, 1).expand(size, size)
    cols = rows.T
    return torch.stack([rows, cols, rows * cols])


class ShapeTokenizer:
    """Word-level tokenizer of the shapes grammar: ``<bos>``, one id per word, ``<eos>``, then ``<pad>`` up to length.

    The vocabulary is :data:`VOCAB` (14 words, ``<pad>`` = 0, ``<bos>`` = 1, ``<eos>`` = 2). Words are split on
    whitespace and must be spelled as in the vocabulary (lower case).

    Attributes:
        vocab: the words, index = token id.
        vocab_size: ``len(vocab)``.
        pad_id: id of ``<pad>`` (0).
        bos_id: id of ``<bos>`` (1).
        eos_id: id of ``<eos>`` (2).

    Example:
        >>> tok = ShapeTokenizer()
        >>> ids = tok.encode("a red circle")
        >>> ids.tolist(), tok.word_positions("a red circle")
        ([1, 3, 7, 11, 2, 0, 0, 0, 0, 0], [1, 2, 3])
        >>> tok.decode(ids)
        'a red circle'
    """

    def __init__(self) -> None:
        self.vocab: tuple[str, ...] = VOCAB
        self.vocab_size = len(VOCAB)
        self._ids = {word: i for i, word in enumerate(VOCAB)}
        self.pad_id, self.bos_id, self.eos_id = self._ids["<pad>"], self._ids["<bos>"], self._ids["<eos>"]

    def _words(self, caption: str) -> list[str]:
        if not isinstance(caption, str):
            raise TypeError(f"ShapeTokenizer expects a caption string, got {type(caption).__name__}.")
        words = caption.split()
        for word in words:
            if word not in self._ids or word.startswith("<"):
                raise ValueError(f"Unknown word {word!r} in caption {caption!r}. The vocabulary is "
                                 f"{list(VOCAB[3:])} (lower case); rephrase the caption with these words.")  # fmt: skip
        return words

    def ids(self, caption: str, max_length: int = MAX_TOKENS) -> list[int]:
        """:meth:`encode` as a plain list of ``max_length`` ints."""
        words = self._words(caption)
        if len(words) + 2 > max_length:
            raise ValueError(f"Caption {caption!r} has {len(words)} words: with <bos> and <eos> it needs "
                             f"{len(words) + 2} tokens, more than max_length={max_length}. Shorten the caption or "
                             "raise max_length.")  # fmt: skip
        ids = [self.bos_id, *(self._ids[w] for w in words), self.eos_id]
        return ids + [self.pad_id] * (max_length - len(ids))

    def encode(self, caption: str, max_length: int = MAX_TOKENS) -> Tensor:
        """Token ids ``(max_length,)`` int64: ``<bos>``, one id per word, ``<eos>``, ``<pad>`` to the length.

        Raises:
            ValueError: an unknown word, or a caption longer than ``max_length - 2`` words.
        """
        return torch.tensor(self.ids(caption, max_length), dtype=torch.long)

    def decode(self, tokens: Tensor | Sequence[int]) -> str:
        """The words between ``<bos>`` and the first ``<eos>`` (``<pad>`` and ``<bos>`` are skipped), space-joined.

        Raises:
            ValueError: a token id outside ``0 .. vocab_size - 1``, or ``tokens`` that are not one row of ids.
        """
        if isinstance(tokens, Tensor):
            if tokens.ndim != 1:
                raise ValueError(f"decode expects one caption's ids (L,), got shape {tuple(tokens.shape)}; decode "
                                 "the rows of a batch one by one.")  # fmt: skip
            tokens = tokens.tolist()
        words = []
        for t in tokens:
            if not 0 <= int(t) < self.vocab_size:
                raise ValueError(f"Token id {t} is outside the vocabulary (0 .. {self.vocab_size - 1}).")
            if t == self.eos_id:
                break
            if t not in (self.pad_id, self.bos_id):
                words.append(VOCAB[t])
        return " ".join(words)

    def word_positions(self, caption: str) -> list[int]:
        """The token index of each word of ``caption``: word i sits at i + 1 (``<bos>`` is token 0).

        Raises:
            ValueError: an unknown word.
        """
        return [i + 1 for i in range(len(self._words(caption)))]


def _shape_masks(shape: Tensor, r: Tensor, cy: Tensor, cx: Tensor, size: int) -> Tensor:
    """Masks ``(m, size, size)`` of m objects of ``shape`` id, integer radius ``r`` and centre pixel ``(cy, cx)``.

    All three fit the box of half-side r around the centre: circle ``dx² + dy² <= r² + r`` (the +r rounds small
    circles, so none is a full rectangle), square ``|dx|, |dy| <= r``, upright triangle (apex at dy = −r, base of
    width 2r + 1 at dy = +r) ``|dy| <= r and 2|dx| <= dy + r``.
    """
    pos = torch.arange(size)
    dy, dx = pos.view(1, -1, 1) - cy.view(-1, 1, 1), pos.view(1, 1, -1) - cx.view(-1, 1, 1)
    r, shape = r.view(-1, 1, 1), shape.view(-1, 1, 1)
    circle = dx * dx + dy * dy <= r * r + r
    square = (dx.abs() <= r) & (dy.abs() <= r)
    triangle = (dy.abs() <= r) & (2 * dx.abs() <= dy + r)
    return torch.where(shape == 0, circle, torch.where(shape == 1, square, triangle))


def _radii(size: int) -> tuple[int, int]:
    """The object radius range at this size: 2–4 px at 16 px, scaled linearly."""
    return max(1, round(2 * size / 16)), round(4 * size / 16)


def _place(shape: Tensor, count: Tensor, size: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Place ``count`` objects per scene without touching: masks ``(n, 3, S, S)`` and centres ``(n, 3, 2)`` (y, x).

    Vectorised over scenes: object j draws its radius, then a centre uniformly among those where it lies inside the
    image and keeps a one-pixel gap (8-neighbourhood) from the objects already placed, found with one convolution of
    the dilated occupancy per (shape, radius). A scene left without room for an object gets all its radii and
    centres redrawn (its shapes stay), so every scene ends with exactly ``count`` objects.
    """
    n, (r_min, r_max) = len(shape), _radii(size)
    width = 2 * r_max + 1
    one = torch.ones(1, dtype=torch.long)
    # (1, 1, w, w) conv kernel per (shape, radius): the object's mask centred in a w × w window
    kernels = {(s, rr): _shape_masks(one * s, one * rr, one * r_max, one * r_max, width).float()[None]
               for s in range(len(SHAPES)) for rr in range(r_min, r_max + 1)}  # fmt: skip
    masks = torch.zeros(n, _OBJECTS, size, size, dtype=torch.bool)
    centres = torch.zeros(n, _OBJECTS, 2, dtype=torch.long)
    pos = torch.arange(size)
    pending = torch.arange(n)
    while len(pending):
        m = len(pending)
        radius = torch.randint(r_min, r_max + 1, (m, _OBJECTS), generator=g)
        u = torch.rand(m, _OBJECTS, size * size, generator=g)
        occupied = torch.zeros(m, 1, size, size)  # the placed objects, dilated by one pixel
        ok = torch.ones(m, dtype=torch.bool)
        for j in range(_OBJECTS):
            active, sh, r = count[pending] > j, shape[pending, j], radius[:, j]
            inside = (pos >= r.view(-1, 1)) & (pos <= (size - 1 - r).view(-1, 1))  # (m, S): centre rows/columns
            free = inside[:, :, None] & inside[:, None, :]
            if j > 0:
                hit = torch.zeros(m, size, size)
                for (s, rr), kernel in kernels.items():
                    rows = active & (sh == s) & (r == rr)
                    if rows.any():
                        hit[rows] = F.conv2d(occupied[rows], kernel, padding=r_max)[:, 0]
                free &= hit < 0.5
            score = torch.where(free.flatten(1), u[:, j], -1.0)
            best = score.argmax(1)
            ok &= ~active | (score.max(1).values >= 0)
            cy, cx = best // size, best % size
            mask = _shape_masks(sh, r, cy, cx, size) & active.view(-1, 1, 1)
            occupied = torch.maximum(occupied, F.max_pool2d(mask[:, None].float(), 3, stride=1, padding=1))
            centres[pending[ok], j] = torch.stack([cy, cx], 1)[ok]
            masks[pending[ok], j] = mask[ok]
        pending = pending[~ok]
    return masks, centres


def captioned_shapes(
    n: int,
    size: int = 16,
    seed: int = 0,
    hard_fraction: float = 0.0,
    shared_colour_fraction: float = 0.0,
    textured: bool = False,
) -> dict[str, Tensor | list]:
    """Generate ``n`` captioned shape scenes with per-object masks (Segment Anyword card §6, 16 × 16 by default).

    Each scene holds 1–3 objects (object slots 0, 1, 2; absent slots have empty masks) of distinct shape in easy
    scenes. Object 0 is always named. With one object the caption is ``"a <colour> <shape>"``; with more, an easy
    caption names object 0 alone (1/3) or objects 0 and 1 (2/3), joined by ``"left of"`` (half of the pairs whose
    centres differ in x; the left object is then named first) or else ``"and"``. Exactly ``round(hard_fraction · n)``
    scenes (at random positions) are *hard*: 2 or 3 objects, the first two of one shape and different colours, both
    named; a third object has another shape. ``round(shared_colour_fraction · n)`` other scenes (at most as many as
    remain) are *shared-colour*: 2 or 3 objects of distinct shapes, all in one colour, so that the colour word cannot
    tell the named object from the others (colour matching, per pixel, cannot; the shape word, or with ``textured``
    its texture, can). Colours are drawn independently otherwise. Objects keep at least one background pixel between
    them (8-neighbourhood); centres are whole pixels. Pixels take the :data:`PALETTE`
    colour of their object or the grey background, plus N(0, 0.05²) noise, clamped to [-1, 1].

    Args:
        n: number of scenes, ``>= 0``.
        size: image side S in pixels, ``>= 16``; object radii are ``round(2S/16) .. round(4S/16)``.
        seed: seed of everything drawn (same seed and arguments, same scenes).
        hard_fraction: fraction of hard scenes, in [0, 1].
        shared_colour_fraction: fraction of shared-colour scenes, in [0, 1 − hard_fraction].
        textured: each shape carries its own texture (circles in horizontal stripes, squares in vertical stripes,
            triangles in a checkerboard, ±0.2 around the colour), so the shape word, like a natural noun, tells what
            every pixel of the object looks like, not only where its outline runs. Off: flat colours (the card's §6).

    Returns:
        ``"image"`` (n, 3, S, S) float32 in [-1, 1]; ``"tokens"`` (n, 10) int64 (see :class:`ShapeTokenizer`);
        ``"caption"`` list of n str; ``"masks"`` (n, 3, S, S) bool, one per object slot; ``"phrase_tokens"``
        (n, 2, 2) int64, per named phrase the token positions of [its colour word, its shape word] (−1 for a
        missing second phrase); ``"phrase_object"`` (n, 2) int64, the object slot each phrase names (−1 if none);
        ``"phrase_class"`` (n, 2) int64, the phrase's shape id (index into :data:`SHAPES`; −1 if none);
        ``"hard"`` (n,) bool; ``"shared_colour"`` (n,) bool.

    Raises:
        ValueError: ``n < 0``, ``size < 16``, ``hard_fraction`` outside [0, 1] or ``shared_colour_fraction``
            outside [0, 1 − hard_fraction].

    Example:
        >>> data = captioned_shapes(4, seed=0, hard_fraction=0.5)
        >>> data["image"].shape, data["masks"].shape, data["tokens"].shape, int(data["hard"].sum())
        (torch.Size([4, 3, 16, 16]), torch.Size([4, 3, 16, 16]), torch.Size([4, 10]), 2)
        >>> ShapeTokenizer().decode(data["tokens"][0]) == data["caption"][0]
        True
        >>> shared = captioned_shapes(4, seed=0, shared_colour_fraction=1.0)
        >>> shared["caption"][1], shared["masks"][1].flatten(1).any(1).tolist()  # three yellow objects, two named
        ('a yellow circle and a yellow square', [True, True, True])
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n is a number of scenes; expected an int >= 0, got {n!r}.")
    if isinstance(size, bool) or not isinstance(size, int) or size < 16:
        raise ValueError(f"size must be an int >= 16 pixels (three separated objects of radius 2-4 px need the room), "
                         f"got {size!r}.")  # fmt: skip
    if not 0.0 <= hard_fraction <= 1.0:
        raise ValueError(f"hard_fraction is a fraction of the scenes; expected [0, 1], got {hard_fraction}.")
    if not 0.0 <= shared_colour_fraction <= 1.0 - hard_fraction + 1e-9:
        raise ValueError(
            f"shared_colour_fraction is a fraction of the scenes that are not hard; expected [0, "
            f"{1 - hard_fraction:g}] with hard_fraction={hard_fraction}, got {shared_colour_fraction}."
        )
    g = torch.Generator().manual_seed(seed)
    num_shapes, num_colours = len(SHAPES), len(COLOURS)
    order = torch.randperm(n, generator=g)
    hard = torch.zeros(n, dtype=torch.bool)
    hard[order[: round(hard_fraction * n)]] = True
    shared = torch.zeros(n, dtype=torch.bool)
    n_hard = round(hard_fraction * n)
    shared[order[n_hard : n_hard + min(round(shared_colour_fraction * n), n - n_hard)]] = True
    # objects per scene: easy 1-3, hard and shared-colour 2-3
    count = torch.where(hard | shared, torch.randint(2, 4, (n,), generator=g), torch.randint(1, 4, (n,), generator=g))
    # shapes: easy, a random order of the three shapes; hard, s0 = s1 and a distractor of another shape
    easy_shape = torch.rand(n, num_shapes, generator=g).argsort(1)
    s0 = torch.randint(0, num_shapes, (n,), generator=g)
    s2 = (s0 + torch.randint(1, num_shapes, (n,), generator=g)) % num_shapes
    shape = torch.where(hard[:, None], torch.stack([s0, s0, s2], 1), easy_shape)
    # colours: independent, except that the two named objects of a hard scene differ
    colour = torch.randint(0, num_colours, (n, _OBJECTS), generator=g)
    colour[:, 1] = torch.where(hard, (colour[:, 0] + torch.randint(1, num_colours, (n,), generator=g)) % num_colours,
                               colour[:, 1])  # fmt: skip
    colour = torch.where(shared[:, None], colour[:, :1], colour)  # shared-colour scenes: every object in colour 0
    two_phrases = hard | ((count >= 2) & (torch.rand(n, generator=g) < 2 / 3))
    want_left_of = torch.rand(n, generator=g) < 0.5
    masks, centres = _place(shape, count, size, g)

    # render: grey background, objects painted in their colours, noise everywhere
    rgb = torch.tensor([PALETTE[c] for c in COLOURS])  # (4, 3)
    image = torch.tensor(PALETTE["background"]).view(1, 3, 1, 1).expand(n, 3, size, size).clone()
    for j in range(_OBJECTS):
        paint = rgb[colour[:, j]].view(n, 3, 1, 1)
        if textured:
            paint = paint + TEXTURE_AMPLITUDE * _textures(size)[shape[:, j]][:, None]
        image = torch.where(masks[:, j, None], paint, image)
    image = (image + NOISE_STD * torch.randn(n, 3, size, size, generator=g)).clamp(-1.0, 1.0)

    # captions: "left of" only where the two named centres differ in x; the left object is then named first
    x0, x1 = centres[:, 0, 1], centres[:, 1, 1]
    left_of = two_phrases & want_left_of & (x0 != x1)
    first = torch.where(left_of & (x1 < x0), 1, 0)
    phrase_object = torch.stack([first, 1 - first], 1)
    phrase_object[:, 1] = torch.where(two_phrases, phrase_object[:, 1], -1)
    shape_of = shape.gather(1, phrase_object.clamp_min(0))
    phrase_class = torch.where(phrase_object >= 0, shape_of, -1)
    # token positions of [colour, shape]: "<bos> a C S ..." puts them at 2, 3; the second phrase "and a C S" at 6, 7
    # and "left of a C S" at 7, 8
    second = torch.where(left_of, 7, 6)
    phrase_tokens = torch.stack([torch.tensor([2, 3]).expand(n, 2), torch.stack([second, second + 1], 1)], 1)
    phrase_tokens[:, 1] = torch.where(two_phrases[:, None], phrase_tokens[:, 1], -1)

    tokenizer, captions, ids = ShapeTokenizer(), [], []
    colours, shapes = colour.tolist(), shape.tolist()
    for i, (objects, left) in enumerate(zip(phrase_object.tolist(), left_of.tolist(), strict=True)):
        phrases = [f"a {COLOURS[colours[i][o]]} {SHAPES[shapes[i][o]]}" for o in objects if o >= 0]
        captions.append((" left of " if left else " and ").join(phrases))
        ids.append(tokenizer.ids(captions[-1]))
    return {
        "image": image.float(),
        "tokens": torch.tensor(ids, dtype=torch.long).view(n, MAX_TOKENS),
        "caption": captions,
        "masks": masks,
        "phrase_tokens": phrase_tokens,
        "phrase_object": phrase_object,
        "phrase_class": phrase_class,
        "hard": hard,
        "shared_colour": shared,
    }


class CaptionedShapesDataModule(BatchedDataModule):
    """Captioned shape scenes as dict batches for text-to-image pretraining and grounded segmentation (Segment Anyword).

    Batches hold every key of :func:`captioned_shapes` but the captions: ``image`` (B, 3, S, S) float32 in [-1, 1],
    ``tokens`` (B, 10) int64, ``masks`` (B, 3, S, S) bool, ``phrase_tokens`` (B, 2, 2), ``phrase_object`` (B, 2) and
    ``phrase_class`` (B, 2) int64, ``hard`` (B,) bool. The caption strings stay here, ``captions[split]`` (row i is
    sample i of the split's ordered val/test loaders; the training loader shuffles).

    Each split is generated in ``setup`` with its own seed ``1000 · seed + k``, k = 0 (train), 1 (val), 2 (test), so
    no two splits (nor two DataModule seeds below 1000 apart) share scenes. The training split has
    ``hard_fraction_train`` hard scenes; validation and test have ``hard_fraction_test`` (validation mirrors the test
    mix), ``round(fraction · n)`` scenes each.

    Args:
        size: image side S in pixels, ``>= 16``.
        n_train: training scenes.
        n_val: validation scenes.
        n_test: test scenes.
        hard_fraction_test: fraction of hard scenes (two named objects of one shape) in validation and test, [0, 1].
        hard_fraction_train: fraction of hard scenes in training, [0, 1].
        shared_colour_fraction_test / shared_colour_fraction_train: fraction of shared-colour scenes (every object in
            one colour: only the shape word names the object), in [0, 1 − the split's hard fraction].
        textured: each shape drawn in its own texture (see :func:`captioned_shapes`).
        batch_size: scenes per batch.
        seed: the seed the split seeds derive from, ``>= 0``.
        num_workers: DataLoader workers.

    Attributes:
        tokenizer: the :class:`ShapeTokenizer` of the captions.
        vocab_size: number of token ids (14).
        max_length: tokens per caption (10).
        num_classes: number of shape classes (3), the classes of ``phrase_class`` (for per-class mIoU).
        captions: split name -> list of caption strings (after ``setup``).

    Raises:
        ValueError: an argument out of its range.

    Example:
        >>> dm = CaptionedShapesDataModule(n_train=64, n_val=16, n_test=16, batch_size=8)
        >>> dm.setup()
        >>> batch = next(iter(dm.test_dataloader()))
        >>> {key: tuple(value.shape) for key, value in batch.items()}  # doctest: +NORMALIZE_WHITESPACE
        {'image': (8, 3, 16, 16), 'tokens': (8, 10), 'masks': (8, 3, 16, 16), 'phrase_tokens': (8, 2, 2),
         'phrase_object': (8, 2), 'phrase_class': (8, 2), 'hard': (8,), 'shared_colour': (8,)}
        >>> len(dm.captions["test"]), int(dm.test_set.data["hard"].sum())  # hard_fraction_test = 0.5
        (16, 8)
    """

    def __init__(
        self,
        size: int = 16,
        n_train: int = 8000,
        n_val: int = 256,
        n_test: int = 200,
        hard_fraction_test: float = 0.5,
        hard_fraction_train: float = 0.2,
        shared_colour_fraction_test: float = 0.0,
        shared_colour_fraction_train: float = 0.0,
        textured: bool = False,
        batch_size: int = 32,
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if size < 16:
            raise ValueError(f"size must be >= 16 pixels (three separated objects of radius 2-4 px need the room), "
                             f"got {size}.")  # fmt: skip
        if min(n_train, n_val, n_test, batch_size) < 1 or num_workers < 0 or seed < 0:
            raise ValueError(f"need n_train, n_val, n_test, batch_size >= 1 and num_workers, seed >= 0, got "
                             f"n_train={n_train}, n_val={n_val}, n_test={n_test}, batch_size={batch_size}, "
                             f"num_workers={num_workers}, seed={seed}.")  # fmt: skip
        fractions = {"hard_fraction_test": hard_fraction_test, "hard_fraction_train": hard_fraction_train}
        for name, fraction in fractions.items():
            if not 0.0 <= fraction <= 1.0:
                raise ValueError(f"{name} is a fraction of the scenes; expected [0, 1], got {fraction}.")
        for split, hard in (("test", hard_fraction_test), ("train", hard_fraction_train)):
            shared = shared_colour_fraction_test if split == "test" else shared_colour_fraction_train
            if not 0.0 <= shared <= 1.0 - hard + 1e-9:
                raise ValueError(f"shared_colour_fraction_{split} must be in [0, 1 - hard_fraction_{split}] = "
                                 f"[0, {1 - hard:g}], got {shared}.")  # fmt: skip
        self.save_hyperparameters()
        self.tokenizer = ShapeTokenizer()
        self.vocab_size = self.tokenizer.vocab_size
        self.max_length = MAX_TOKENS
        self.num_classes = len(SHAPES)
        self.captions: dict[str, list[str]] = {}

    def split_seed(self, split: str) -> int:
        """The generator seed of a split (``"train"``, ``"val"`` or ``"test"``): ``1000 · seed + k``."""
        return _SEED_STRIDE * self.hparams.seed + _SEED_OFFSETS[split]

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        hp = self.hparams
        train = (hp.n_train, hp.hard_fraction_train, hp.shared_colour_fraction_train)
        test = (hp.hard_fraction_test, hp.shared_colour_fraction_test)
        sizes = {"train": train, "val": (hp.n_val, *test), "test": (hp.n_test, *test)}
        sets = {}
        for split, (n, fraction, shared) in sizes.items():
            data = captioned_shapes(n, size=hp.size, seed=self.split_seed(split), hard_fraction=fraction,
                                    shared_colour_fraction=shared, textured=hp.textured)  # fmt: skip
            self.captions[split] = data.pop("caption")
            sets[split] = DictBatches(data)
        self.train_set, self.val_set, self.test_set = sets["train"], sets["val"], sets["test"]

    def describe(self) -> str:
        """One line for model cards."""
        hp = self.hparams
        r_min, r_max = _radii(hp.size)
        seeds = "/".join(str(self.split_seed(s)) for s in ("train", "val", "test"))
        return (f"captioned shapes (Segment Anyword card §6): {hp.size}×{hp.size} RGB, 1-3 "
                f"{'textured' if hp.textured else 'flat'} objects of radius "
                f"{r_min}-{r_max} px, captions of <= {MAX_TOKENS} tokens; {hp.n_train}/{hp.n_val}/{hp.n_test} "
                f"train/val/test scenes, {hp.hard_fraction_train:.0%}/{hp.hard_fraction_test:.0%}/"
                f"{hp.hard_fraction_test:.0%} hard, {hp.shared_colour_fraction_train:.0%}/"
                f"{hp.shared_colour_fraction_test:.0%}/{hp.shared_colour_fraction_test:.0%} shared-colour, seeds {seeds}")  # fmt: skip
