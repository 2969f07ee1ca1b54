"""Test-time textual inversion, DDIM inversion and Direct-Inversion re-denoising (Segment Anyword, card §2 steps 2–3).

* :func:`substituted_embeddings` swaps the token embeddings at given positions for given vectors through a forward
  hook on the text encoder's ``nn.Embedding``; the embedding table is never written (card pitfall: no leakage of
  optimised vectors across images).
* :func:`textual_inversion` optimises one vector per target token on a single image with the frozen LDM loss
  ``L(V) = E_{t,ε} ‖ε − ε_θ(√ᾱ_t x0 + √(1−ᾱ_t) ε, t, c_φ(s; V))‖²``.
* :func:`ddim_invert` maps x0 to x_T with diffusers' ``DDIMInverseScheduler``; :func:`ddim_denoise` runs the
  ``DDIMScheduler`` pass back, with Direct Inversion (PnP Inversion, Ju et al., ICLR 2024) keeping it on the inversion
  path. A :func:`~zoo.models.segment_anyword.attention.record_cross_attention` recorder records during that pass.

All functions take any diffusers ``UNet2DConditionModel`` and any text encoder whose token embedding is an
``nn.Embedding`` (the zoo's toy encoder, transformers' ``CLIPTextModel.get_input_embeddings()``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from diffusers import DDIMInverseScheduler, DDIMScheduler, DDPMScheduler
from torch import Tensor, nn

__all__ = ["ddim_denoise", "ddim_invert", "ldm_loss", "substituted_embeddings", "textual_inversion"]


@contextmanager
def substituted_embeddings(embedding: nn.Embedding, positions: Tensor, vectors: Tensor) -> Iterator[None]:
    """Within the block, ``embedding(ids)`` returns ``vectors`` at ``positions`` instead of the table's rows.

    A forward hook replaces the outputs (differentiably: gradients reach ``vectors``); it is removed on exit, even
    after an exception, and the table itself is never modified.

    Args:
        embedding: the text encoder's token embedding (``text_encoder.get_input_embeddings()``).
        positions: ``(B, K)`` token positions per batch item (LongTensor).
        vectors: ``(B, K, D)`` the embeddings to use there.

    Raises:
        ValueError: mismatched shapes (at entry), or a call inside the block with another batch size or too few tokens.

    Example:
        >>> emb = nn.Embedding(10, 4)
        >>> ids = torch.tensor([[1, 2, 3]])
        >>> with substituted_embeddings(emb, torch.tensor([[1]]), torch.zeros(1, 1, 4)):
        ...     inside = emb(ids)
        >>> inside[0, 1].abs().sum().item(), torch.equal(inside[0, [0, 2]], emb(ids)[0, [0, 2]])
        (0.0, True)
    """
    if not isinstance(embedding, nn.Embedding):
        raise TypeError(f"expected the text encoder's token embedding as an nn.Embedding (get_input_embeddings()), "
                        f"got {type(embedding).__name__}")  # fmt: skip
    if positions.ndim != 2 or vectors.shape != (*positions.shape, embedding.embedding_dim):
        raise ValueError(f"expected positions (B, K) and vectors (B, K, {embedding.embedding_dim}), got "
                         f"{tuple(positions.shape)} and {tuple(vectors.shape)}")  # fmt: skip
    positions = positions.long()

    def substitute(module: nn.Module, args: tuple[Any, ...], output: Tensor) -> Tensor:
        if output.ndim != 3 or output.shape[0] != positions.shape[0] or output.shape[1] <= int(positions.max()):
            raise ValueError(f"substituted_embeddings expects token ids (B={positions.shape[0]}, T > "
                             f"{int(positions.max())}) inside its block, but the embedding returned "
                             f"{tuple(output.shape)}. Encode the same batch the positions were given for.")  # fmt: skip
        rows = torch.arange(positions.shape[0], device=output.device)[:, None].expand_as(positions)
        # index_put (not in place) keeps the table's output intact and lets the gradient flow into `vectors`
        return output.index_put((rows, positions.to(output.device)), vectors.to(output.dtype))

    handle = embedding.register_forward_hook(substitute)
    try:
        yield
    finally:
        handle.remove()


def ldm_loss(
    unet: nn.Module,
    states: Tensor,
    x0: Tensor,
    t: Tensor,
    noise: Tensor,
    alphas_cumprod: Tensor,
    prediction_type: str = "epsilon",
) -> Tensor:
    """The LDM loss ``mean ‖target − f_θ(√ᾱ_t x0 + √(1−ᾱ_t) ε, t, states)‖²`` over a batch of (t, ε) draws.

    The target is ε (``"epsilon"``), ``v = √ᾱ_t ε − √(1−ᾱ_t) x0`` (``"v_prediction"``) or x0 (``"sample"``).

    Args:
        unet: the denoiser (called as ``unet(x_t, t, encoder_hidden_states=states).sample``).
        states: ``(N, T, D)`` text states, one row per draw.
        x0: ``(N, C, H, W)`` clean images / latents, one per draw.
        t: ``(N,)`` integer timesteps; ``noise``: ``(N, C, H, W)``.
        alphas_cumprod: ᾱ of the training schedule ``(num_train_timesteps,)``.
        prediction_type: the UNet's parametrisation.

    Example:
        >>> from diffusers import UNet2DConditionModel
        >>> _ = torch.manual_seed(0)
        >>> unet = UNet2DConditionModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
        ...     block_out_channels=(16, 32), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        ...     up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32, norm_num_groups=8)
        >>> x0 = torch.rand(2, 3, 8, 8)
        >>> ldm_loss(unet, torch.randn(2, 4, 32), x0, torch.tensor([10, 500]), torch.randn_like(x0),
        ...          DDPMScheduler().alphas_cumprod).ndim
        0
    """
    a = alphas_cumprod.to(device=x0.device, dtype=x0.dtype)[t.to(x0.device)].view(-1, *([1] * (x0.ndim - 1)))
    x_t = a.sqrt() * x0 + (1 - a).sqrt() * noise
    if prediction_type == "epsilon":
        target = noise
    elif prediction_type == "v_prediction":
        target = a.sqrt() * noise - (1 - a).sqrt() * x0
    elif prediction_type == "sample":
        target = x0
    else:
        raise ValueError(f"prediction_type must be 'epsilon', 'v_prediction' or 'sample', got {prediction_type!r}")
    dtype = next(unet.parameters()).dtype
    pred = unet(x_t.to(dtype), t, encoder_hidden_states=states.to(dtype)).sample
    return (pred.float() - target.float()).square().mean()


def textual_inversion(
    unet: nn.Module,
    encode_text: Callable[[Tensor], Tensor],
    embedding: nn.Embedding,
    input_ids: Tensor,
    positions: Tensor,
    x0: Tensor,
    scheduler: DDPMScheduler | DDIMScheduler,
    steps: int = 40,
    lr: float = 5e-3,
    draws: int = 8,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Test-time multi-concept textual inversion: one vector per target token, fitted to one image per batch item.

    Card §2 step 2: vectors ``V`` initialised from the original token embeddings at ``positions`` minimise the LDM
    loss (:func:`ldm_loss`, ε target, or v for a ``v_prediction`` scheduler) with ``draws`` (t, ε) pairs per image per
    step, t uniform over the training timesteps, in one batched UNet call of ``B · draws``; Adam, ``steps`` steps. The
    text is encoded once per step with the vectors substituted (:func:`substituted_embeddings`). Every other parameter
    is frozen: the UNet's and the embedding's ``requires_grad`` are switched off for the run and restored afterwards,
    and gradients are taken with ``torch.autograd.grad`` with respect to ``V`` only, so no parameter of the UNet or the
    text encoder gains a ``.grad`` or changes. Train / eval mode is left as the caller set it. It may be called under
    ``torch.no_grad()`` or ``torch.inference_mode()`` (how inference is run): autograd is enabled locally. Run it
    outside ``record_cross_attention`` (the recorder would record these calls).

    Args:
        unet: the frozen denoiser (a diffusers ``UNet2DConditionModel``).
        encode_text: token ids ``(B, T)`` → text states ``(B, T, D_text)``, calling ``embedding`` on the ids (e.g.
            ``lambda ids: clip(ids).last_hidden_state``).
        embedding: the text encoder's token embedding (``nn.Embedding``, width D).
        input_ids: ``(B, T)`` the prompt's token ids.
        positions: ``(B, K)`` positions of the target tokens in ``input_ids``.
        x0: ``(B, C, H, W)`` the images (pixel space) or VAE latents the UNet denoises.
        scheduler: the UNet's training scheduler (``alphas_cumprod``, ``num_train_timesteps``, ``prediction_type``).
        steps: Adam steps (the paper: 1100; the toy: 40).
        lr: Adam learning rate (the paper: 0.005).
        draws: (t, ε) pairs per image per step (the paper's batch of 8).
        generator: the random source of t and ε (its device is where they are drawn).

    Returns:
        ``(B, K, D)`` the optimised vectors (detached), to use with :func:`substituted_embeddings`.

    Example:
        >>> from diffusers import UNet2DConditionModel
        >>> _ = torch.manual_seed(0)
        >>> unet = UNet2DConditionModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
        ...     block_out_channels=(16, 32), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        ...     up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32, norm_num_groups=8)
        >>> emb = nn.Embedding(10, 32)
        >>> ids, pos = torch.tensor([[1, 4, 5, 2]]), torch.tensor([[1, 2]])
        >>> V = textual_inversion(unet, emb, emb, ids, pos, torch.rand(1, 3, 8, 8), DDPMScheduler(), steps=2, draws=2)
        >>> V.shape, V.requires_grad, emb.weight.requires_grad
        (torch.Size([1, 2, 32]), False, True)
    """
    if input_ids.ndim != 2 or positions.ndim != 2 or x0.ndim != 4 or not len(input_ids) == len(positions) == len(x0):
        raise ValueError(f"expected input_ids (B, T), positions (B, K) and x0 (B, C, H, W) with one B, got "
                         f"{tuple(input_ids.shape)}, {tuple(positions.shape)} and {tuple(x0.shape)}")  # fmt: skip
    if steps < 0 or draws < 1:
        raise ValueError(f"expected steps >= 0 and draws >= 1, got steps={steps}, draws={draws}")
    # Autograd is needed even where the caller runs inference (under torch.no_grad() or torch.inference_mode(), as in
    # Lightning's test loop): enable it locally. Tensors made in inference mode cannot enter autograd: clone them out.
    with torch.inference_mode(False), torch.enable_grad():
        input_ids, x0 = input_ids.clone(), x0.clone()
        positions = positions.long().to(input_ids.device).clone()
        return _fit_vectors(unet, encode_text, embedding, input_ids, positions, x0, scheduler, steps, lr, draws,
                            generator)  # fmt: skip


def _fit_vectors(
    unet: nn.Module,
    encode_text: Callable[[Tensor], Tensor],
    embedding: nn.Embedding,
    input_ids: Tensor,
    positions: Tensor,
    x0: Tensor,
    scheduler: DDPMScheduler | DDIMScheduler,
    steps: int,
    lr: float,
    draws: int,
    generator: torch.Generator | None,
) -> Tensor:
    """:func:`textual_inversion`'s loop (autograd enabled, ``positions`` long on the ids' device)."""
    config = scheduler.config
    num_timesteps, prediction_type = config.num_train_timesteps, config.get("prediction_type", "epsilon")
    alphas_cumprod = scheduler.alphas_cumprod.to(x0.device).clone()
    with torch.no_grad():
        init = embedding(input_ids.gather(1, positions))  # (B, K, D): the original token embeddings
    vectors = init.detach().clone().float().requires_grad_(True)
    optimizer = torch.optim.Adam([vectors], lr=lr)
    frozen = [*unet.parameters(), *embedding.parameters()]
    flags = [p.requires_grad for p in frozen]
    draw_device = generator.device if generator is not None else x0.device
    x0_draws = x0.repeat_interleave(draws, 0)
    try:
        for p in frozen:
            p.requires_grad_(False)  # no weight gradients are computed, only the path back to V
        for _ in range(steps):
            t = torch.randint(0, num_timesteps, (len(x0_draws),), generator=generator, device=draw_device)
            noise = torch.randn(x0_draws.shape, generator=generator, device=draw_device, dtype=x0.dtype)
            with substituted_embeddings(embedding, positions, vectors):
                states = encode_text(input_ids)
            states = states.repeat_interleave(draws, 0)
            loss = ldm_loss(unet, states, x0_draws, t.to(x0.device), noise.to(x0.device), alphas_cumprod,
                            prediction_type)  # fmt: skip
            (grad,) = torch.autograd.grad(loss, [vectors])
            vectors.grad = grad
            optimizer.step()
            vectors.grad = None
    finally:
        for p, flag in zip(frozen, flags, strict=True):
            p.requires_grad_(flag)
    return vectors.detach().to(init.dtype)


def _scheduler_config(scheduler_config: Mapping[str, Any] | Any | None) -> dict[str, Any]:
    """A plain config dict from a scheduler, a config mapping or None (diffusers' DDPM defaults)."""
    if scheduler_config is None:
        scheduler_config = DDPMScheduler().config
    elif hasattr(scheduler_config, "config"):
        scheduler_config = scheduler_config.config
    if not isinstance(scheduler_config, Mapping):
        raise TypeError(f"expected a scheduler or its config (a mapping), got {type(scheduler_config).__name__}")
    # Clipping x̂0 to [-1, 1] makes the inversion lossy (and VAE latents are not in [-1, 1]): off in both directions.
    return {**dict(scheduler_config), "clip_sample": False}


def _predict(unet: nn.Module, x: Tensor, t: Tensor, states: Tensor) -> Tensor:
    dtype = next(unet.parameters()).dtype
    t = t.to(x.device).expand(len(x))
    return unet(x.to(dtype), t, encoder_hidden_states=states.to(dtype)).sample.to(x.dtype)


@torch.no_grad()
def ddim_invert(
    unet: nn.Module,
    states: Tensor,
    x0: Tensor,
    steps: int = 20,
    scheduler_config: Mapping[str, Any] | Any | None = None,
) -> list[Tensor]:
    """DDIM inversion x0 → x_T (η = 0) with diffusers' ``DDIMInverseScheduler``.

    At each of the ascending timesteps t_1 < … < t_N the UNet is evaluated at the current latent with timestep t_i
    (the usual ε(x_{t_{i−1}}, t_i) ≈ ε(x_{t_i}, t_i) approximation) and the deterministic DDIM update moves the latent
    up one level.

    Args:
        unet: the frozen denoiser.
        states: ``(B, T, D)`` the text states that condition it (with the optimised vectors substituted).
        x0: ``(B, C, H, W)`` images or latents.
        steps: number of DDIM steps N.
        scheduler_config: the UNet's training scheduler (or its config); ``clip_sample`` is turned off. None:
            diffusers' ``DDPMScheduler`` defaults (linear β from 1e-4 to 0.02, 1000 steps, ε) — pass the real one.

    Returns:
        ``N + 1`` latents ``[x0, x_{t_1}, …, x_{t_N} = x_T]``, each ``(B, C, H, W)``.

    Example:
        >>> from diffusers import UNet2DConditionModel
        >>> _ = torch.manual_seed(0)
        >>> unet = UNet2DConditionModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
        ...     block_out_channels=(16, 32), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        ...     up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32, norm_num_groups=8)
        >>> latents = ddim_invert(unet, torch.randn(1, 4, 32), torch.rand(1, 3, 8, 8), steps=5)
        >>> len(latents), latents[-1].shape
        (6, torch.Size([1, 3, 8, 8]))
    """
    if x0.ndim != 4 or states.ndim != 3 or len(states) != len(x0):
        raise ValueError(f"expected x0 (B, C, H, W) and states (B, T, D) with one B, got {tuple(x0.shape)} and "
                         f"{tuple(states.shape)}")  # fmt: skip
    scheduler = DDIMInverseScheduler.from_config(_scheduler_config(scheduler_config))
    scheduler.set_timesteps(steps)
    latents = [x0]
    x = x0
    for t in scheduler.timesteps:
        x = scheduler.step(_predict(unet, x, t, states), t, x).prev_sample
        latents.append(x)
    return latents


@torch.no_grad()
def ddim_denoise(
    unet: nn.Module,
    states: Tensor,
    latents_or_xT: list[Tensor] | Tensor,
    steps: int = 20,
    direct: bool = True,
    scheduler_config: Mapping[str, Any] | Any | None = None,
) -> Tensor:
    """The DDIM re-denoising pass x_T → x0 (η = 0) with diffusers' ``DDIMScheduler``, optionally with Direct Inversion.

    Plain (``direct=False``): ``z_{t_{i−1}} = DDIM(z_{t_i}, ε_θ(z_{t_i}, t_i, c))`` from ``z_{t_N} = x_T``; the
    mismatch between the inversion's and the denoising's ε evaluations makes it drift from x0.

    Direct Inversion (``direct=True``; PnP Inversion, Ju et al. 2024, their ``offset_calculate`` and
    ``direct_inversion_p2p_guidance_forward``): with ``z*`` the inverted latents, at step i (timestep ``t_i``,
    descending) the DDIM update gives ``z̃_{t_{i−1}} = DDIM(z_{t_i}, ε_θ(z_{t_i}, t_i, c))``; the offset
    ``δ_i = z*_{t_{i−1}} − z̃_{t_{i−1}}`` is added, ``z_{t_{i−1}} = z̃_{t_{i−1}} + δ_i``. The pass starts at
    ``z_{t_N} = z*_{t_N}``, so every UNet call sees the inverted latent of its level and the final latent equals x0
    (up to rounding). For the single (source) branch used here the offset is exactly the distance to the inversion
    path; PnP Inversion adds the same δ_i to an edited branch. A ``record_cross_attention`` recorder installed on
    ``unet`` records the cross-attention of every call of this pass.

    Args:
        unet: the frozen denoiser.
        states: ``(B, T, D)`` text states.
        latents_or_xT: the list from :func:`ddim_invert` (``steps + 1`` latents; needed for ``direct=True``), or x_T
            ``(B, C, H, W)`` for the plain pass.
        steps: number of DDIM steps; must match the inversion's.
        direct: add the Direct-Inversion offsets.
        scheduler_config: as in :func:`ddim_invert` (the same one).

    Returns:
        ``(B, C, H, W)`` the final latent x0.

    Raises:
        ValueError: ``direct=True`` without the inversion latents, or a number of latents that is not ``steps + 1``.

    Example:
        >>> from diffusers import UNet2DConditionModel
        >>> _ = torch.manual_seed(0)
        >>> unet = UNet2DConditionModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
        ...     block_out_channels=(16, 32), down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        ...     up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32, norm_num_groups=8)
        >>> states, x0 = torch.randn(1, 4, 32), torch.rand(1, 3, 8, 8)
        >>> latents = ddim_invert(unet, states, x0, steps=5)
        >>> (ddim_denoise(unet, states, latents, steps=5) - x0).abs().max().item() < 1e-5
        True
    """
    if isinstance(latents_or_xT, Tensor):
        if direct:
            raise ValueError("direct=True needs the inverted latents: pass the list that ddim_invert returned, "
                             "or set direct=False to denoise from x_T alone")  # fmt: skip
        inverted, x = None, latents_or_xT
    else:
        inverted = list(latents_or_xT)
        if len(inverted) != steps + 1:
            raise ValueError(f"expected steps + 1 = {steps + 1} inverted latents (ddim_invert with steps={steps}), "
                             f"got {len(inverted)}. Use the same steps for both passes.")  # fmt: skip
        x = inverted[-1]
    if x.ndim != 4 or states.ndim != 3 or len(states) != len(x):
        raise ValueError(f"expected latents (B, C, H, W) and states (B, T, D) with one B, got {tuple(x.shape)} and "
                         f"{tuple(states.shape)}")  # fmt: skip
    scheduler = DDIMScheduler.from_config(_scheduler_config(scheduler_config))
    scheduler.set_timesteps(steps)
    for i, t in enumerate(scheduler.timesteps):
        x = scheduler.step(_predict(unet, x, t, states), t, x).prev_sample
        if direct:
            # δ_i = z*_{t_{i−1}} − z̃_{t_{i−1}}; the inversion list is ascending, so level t_{i−1} is index N − 1 − i.
            x = x + (inverted[steps - 1 - i] - x)
    return x
