"""Tests of backtrack-sampling: the Dyck grammar, the cached LM, the samplers, DyckLM, the probe and the data."""

from __future__ import annotations

import itertools

import pytest
import torch
from lightning import Trainer

import zoo
from zoo.datamodules.base import TensorBatches
from zoo.datamodules.grammar import DyckDataModule
from zoo.models.backtrack_sampling import (
    BOS,
    EOS,
    VOCAB,
    CachedLM,
    DyckGrammar,
    FullSequenceLM,
    HFCausalLM,
    TinyCausalLM,
    VerifierProbe,
    block_best_of_n,
    draw,
    generate,
    rejection_sample,
)
from zoo.models.backtrack_sampling.probe_data import error_pairs

_IDS = {"_": 0, "B": 1, "E": 2, "(": 3, ")": 4, "[": 5, "]": 6}


def encode(texts: list[str], width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded token rows and lengths of strings such as ``"B([])E"``."""
    width = width or max(len(t) for t in texts)
    tokens = torch.zeros(len(texts), width, dtype=torch.long)
    for r, text in enumerate(texts):
        tokens[r, : len(text)] = torch.tensor([_IDS[c] for c in text], dtype=torch.long)
    return tokens, torch.tensor([len(t) for t in texts])


def exact(grammar: DyckGrammar):
    """The exact process verifier of ``grammar`` as P(error)."""
    return lambda tokens, lengths, hidden: (~grammar.accept_prefix(tokens, lengths)).float()


def depths(tokens: torch.Tensor) -> torch.Tensor:
    """Running bracket depth of complete strings."""
    step = ((tokens == 3) | (tokens == 5)).long() - ((tokens == 4) | (tokens == 6)).long()
    return step.cumsum(1)


def opener_share(tokens: torch.Tensor) -> float:
    """Share of "(" among the openers."""
    return float((tokens == 3).sum()) / float(((tokens == 3) | (tokens == 5)).sum())


class RecordingLM:
    """Wraps an LM and records the row lengths of every call (to see erased tokens and prompt safety)."""

    def __init__(self, lm) -> None:
        self.lm, self.vocab_size, self.calls = lm, VOCAB, []

    def __call__(self, tokens: torch.Tensor, lengths: torch.Tensor):
        self.calls.append(lengths.clone())
        return self.lm(tokens, lengths)

    def erased(self) -> torch.Tensor:
        """Tokens erased per row: every drop of a row's length between consecutive LM calls."""
        lengths = torch.stack(self.calls)
        return (lengths[:-1] - lengths[1:]).clamp(min=0).sum(0)


def dyck_prompts(grammar: DyckGrammar, n: int, low: int, high: int, seed: int = 0):
    """``n`` valid prefixes (BOS + ``low..high`` brackets) of fresh strings, and their lengths."""
    g = torch.Generator().manual_seed(seed)
    tokens = grammar.sample(n, generator=g)
    lengths = 1 + torch.randint(low, high + 1, (n,), generator=g)
    return tokens, lengths


def random_lm(max_len: int, seed: int = 0) -> TinyCausalLM:
    torch.manual_seed(seed)
    return TinyCausalLM(VOCAB, max_len, d_model=32, n_heads=2, d_mlp=64).eval()


@pytest.fixture(scope="module")
def hub():
    return zoo.load("backtrack-sampling").eval()


@pytest.fixture(scope="module")
def hub_probe():
    return zoo.load("backtrack-sampling-probe").eval()


@pytest.fixture(scope="module")
def shifted():
    dm = DyckDataModule(train_size=64)
    dm.setup("test")
    return dm.test_set.tensors


@pytest.fixture(scope="module")
def pairs(hub, shifted):
    tokens, prompt_lengths = shifted
    return error_pairs(hub.lm, hub.grammar, tokens, prompt_lengths, torch.Generator().manual_seed(0))


# ---------------------------------------------------------------------------------------------------------- grammar
def test_grammar_samples_are_valid_with_depth_and_type_probabilities() -> None:
    """Check that sampled strings are accepted with every prefix, stay within max_depth and follow type_probs."""
    g = torch.Generator().manual_seed(0)
    grammar = DyckGrammar(length=24, max_depth=8, type_probs=(0.2, 0.8))
    x = grammar.sample(600, generator=g)
    n = len(x)
    assert x.shape == (n, 26) and bool((x[:, 0] == BOS).all()) and bool((x[:, -1] == EOS).all())
    assert bool(grammar.accept(x, torch.full((n,), 26)).all())
    for k in range(1, 27):
        assert bool(grammar.accept_prefix(x, torch.full((n,), k)).all()), k
    assert int(depths(x).max()) <= 8 and int(depths(x).min()) >= 0
    assert abs(opener_share(x) - 0.2) < 0.03
    flipped = DyckGrammar(length=24, max_depth=8, type_probs=(0.8, 0.2)).sample(600, generator=g)
    assert abs(opener_share(flipped) - 0.8) < 0.03
    shallow = DyckGrammar(length=24, max_depth=2).sample(300, generator=g)
    assert int(depths(shallow).max()) == 2 and bool(DyckGrammar(24, 2).accept(shallow, torch.full((300,), 26)).all())
    with pytest.raises(ValueError, match="even"):
        DyckGrammar(length=5)
    with pytest.raises(ValueError, match="type_probs"):
        DyckGrammar(type_probs=(0.5, 0.6))


@pytest.mark.parametrize(
    "text, ok",
    [
        ("B(]", False),  # wrong closer
        ("B)", False),  # underflow
        ("B([)", False),  # closer of the wrong type under a deeper stack
        ("B(((", False),  # depth 3 after 3 brackets: only 1 bracket left, it cannot close
        ("B((", True),  # depth 2 with 2 left: still completable
        ("B()E", False),  # EOS too early
        ("B()()EE", False),  # a token after EOS
        ("B()()E(", False),
        ("(())", False),  # no BOS
        ("_(())", False),
        ("B(_", False),  # PAD inside
        ("B([])", True),
        ("B([])E", True),
        ("B([])E_", False),  # longer than a complete string
    ],
)
def test_accept_prefix_rejects_each_error_kind(text: str, ok: bool) -> None:
    """Check that accept_prefix flags wrong closers, underflow, unclosable openers, bad EOS and a missing BOS."""
    grammar = DyckGrammar(length=4, max_depth=4)
    tokens, lengths = encode([text], width=8)
    assert bool(grammar.accept_prefix(tokens, lengths)[0]) is ok
    assert bool(grammar.accept(tokens, lengths)[0]) is (text == "B([])E")


def test_max_depth_is_not_enforced_by_the_verifier() -> None:
    """Check that a prefix deeper than max_depth but completable passes accept_prefix (the spec's pitfall)."""
    grammar = DyckGrammar(length=8, max_depth=2)
    tokens, lengths = encode(["B((((", "B((((("])
    assert grammar.accept_prefix(tokens, lengths).tolist() == [True, False]
    full, full_lengths = encode(["B(((())))E"])
    assert bool(grammar.accept(full, full_lengths)[0])


def test_accept_prefix_matches_brute_force_for_six_brackets() -> None:
    """Check accept_prefix and accept against exhaustive enumeration of Dyck-2 strings of 6 brackets."""
    grammar = DyckGrammar(length=6, max_depth=6)
    valid = []
    for brackets in itertools.product((3, 4, 5, 6), repeat=6):
        stack, ok = [], True
        for t in brackets:
            if t in (3, 5):
                stack.append(t)
            elif not stack or stack.pop() + 1 != t:
                ok = False
                break
        if ok and not stack:
            valid.append((BOS, *brackets, EOS))
    assert len(valid) == 5 * 2**3  # Catalan(3) shapes × 2 types per pair

    def code(rows: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:  # length-tagged base-8 number of a prefix
        powers = 8 ** torch.arange(rows.shape[1])
        mask = torch.arange(rows.shape[1])[None, :] < lengths[:, None]
        return (rows * mask * powers).sum(1) * 16 + lengths

    completable = {(s[:k], k) for s in valid for k in range(1, 9)}
    reference = torch.tensor([sum(t * 8**i for i, t in enumerate(p)) * 16 + k for p, k in completable])
    full_codes = torch.tensor([sum(t * 8**i for i, t in enumerate(s)) * 16 + 8 for s in valid])
    rows, lengths = [], []
    everything = torch.arange(VOCAB)
    no_bos = torch.tensor([0, 2, 3, 4, 5, 6])
    for k in range(1, 9):
        if k <= 4:  # every sequence over the whole vocabulary
            block = torch.cartesian_prod(*[everything] * k).view(-1, k)
        else:  # BOS first, then every non-BOS token
            rest = torch.cartesian_prod(*[no_bos] * (k - 1)).view(-1, k - 1)
            block = torch.cat([torch.full((len(rest), 1), BOS), rest], 1)
        rows.append(torch.nn.functional.pad(block, (0, 8 - k)))
        lengths.append(torch.full((len(block),), k))
    rows, lengths = torch.cat(rows), torch.cat(lengths)
    expected = torch.isin(code(rows, lengths), reference)
    assert int(expected.sum()) == len(completable)
    assert torch.equal(grammar.accept_prefix(rows, lengths), expected)
    assert torch.equal(grammar.accept(rows, lengths), torch.isin(code(rows, lengths), full_codes))


# --------------------------------------------------------------------------------------------------------- CachedLM
def test_cached_lm_matches_full_forward_through_appends_backtracks_and_rewrites() -> None:
    """Check CachedLM equals an uncached forward after appends, backtracks and rewrites, and appends run R positions."""
    model = random_lm(20, seed=3)
    lm = CachedLM(model)
    g = torch.Generator().manual_seed(1)
    R = 6  # noqa: N806
    tokens = torch.randint(0, VOCAB, (R, 20), generator=g)
    lengths = torch.randint(1, 7, (R,), generator=g)
    rows = torch.arange(R)

    def check(cheap: bool) -> None:
        before = lm.positions_run
        logits, hidden = lm(tokens, lengths)
        with torch.no_grad():
            for r in range(R):
                ref_logits, ref_hidden = model(tokens[r : r + 1, : int(lengths[r])])
                torch.testing.assert_close(logits[r], ref_logits[0, -1], atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(hidden[r], ref_hidden[0, -1], atol=1e-5, rtol=1e-5)
        assert lm.positions_run - before == (R if cheap else R * int(lengths.max()))

    def append(which: torch.Tensor) -> None:
        nonlocal lengths
        new = torch.randint(0, VOCAB, (R,), generator=g)
        tokens[rows[which], lengths[which]] = new[which]
        lengths = lengths + which.long()

    check(cheap=False)
    for _ in range(3):
        append(torch.ones(R, dtype=torch.bool))
        check(cheap=True)
    lengths = (lengths - torch.tensor([0, 2, 1, 3, 0, 2])).clamp(min=1)  # backtrack some rows
    check(cheap=True)
    append(torch.ones(R, dtype=torch.bool))  # new tokens where the erased ones were
    check(cheap=True)
    append(torch.tensor([True, False, True, False, False, True]))  # only some rows grow
    check(cheap=True)
    tokens[2, 0] = (tokens[2, 0] + 1) % VOCAB  # a change deep inside one prefix
    check(cheap=False)
    tokens[4] = torch.randint(0, VOCAB, (20,), generator=g)  # a row replaced entirely
    lengths[4] = 9
    check(cheap=False)
    lengths[1] += 2  # a row grows by two tokens at once
    check(cheap=False)
    with pytest.raises(ValueError, match="at least one token"):
        lm(tokens, torch.zeros(R, dtype=torch.long))


# ------------------------------------------------------------------------------------------------------- generate
@pytest.mark.parametrize("which", ["random", "hub"])
def test_plain_sampling_fills_rows_and_charges_completion_queries(which: str, hub, shifted) -> None:
    """Check that plain sampling completes every row to max_length, keeps the prompt and charges L − P queries."""
    if which == "hub":
        lm, (tokens, prompt_lengths), max_length = CachedLM(hub.lm), (t[:64] for t in shifted), 26
    else:
        grammar = DyckGrammar(length=8, max_depth=4)
        lm, max_length = CachedLM(random_lm(10)), 10
        tokens, prompt_lengths = dyck_prompts(grammar, 32, 0, 5)
    out = generate(lm, tokens, prompt_lengths, max_length, generator=torch.Generator().manual_seed(0))
    assert out.tokens.shape == (len(tokens), max_length) and bool((out.lengths == max_length).all())
    assert torch.equal(out.queries, max_length - prompt_lengths)
    assert int(out.backtracks.sum()) == 0 and int(out.verifier_calls.sum()) == 0
    for r in range(len(tokens)):
        p = int(prompt_lengths[r])
        assert torch.equal(out.tokens[r, :p], tokens[r, :p])
    assert len(out.completions()[0]) == max_length - int(prompt_lengths[0])


@pytest.mark.parametrize("which, stride", [("random", 1), ("random", 4), ("hub", 4)])
def test_backtracking_invariants(which: str, stride: int, hub, shifted) -> None:
    """Check backtracks ≤ quota, the prompt is never erased, and queries = kept tokens + erased ≤ kept + Q·B."""
    quota = 3
    if which == "hub":
        grammar, max_length = hub.grammar, 26
        lm = RecordingLM(CachedLM(hub.lm))
        tokens, prompt_lengths = (t[:128] for t in shifted)
    else:
        grammar, max_length = DyckGrammar(length=8, max_depth=4), 10
        lm = RecordingLM(CachedLM(random_lm(10)))
        tokens, prompt_lengths = dyck_prompts(grammar, 48, 0, 5, seed=1)
    out = generate(
        lm,
        tokens,
        prompt_lengths,
        max_length,
        exact(grammar),
        quota=quota,
        stride=stride,
        forbid_repeat=True,
        generator=torch.Generator().manual_seed(0),
    )
    generated = out.lengths - prompt_lengths
    assert bool((out.lengths == max_length).all())
    assert bool((out.backtracks <= quota).all()) and int(out.backtracks.sum()) > 0
    assert bool((torch.stack(lm.calls) >= prompt_lengths).all())  # no call ever saw a row shorter than its prompt
    for r in range(len(tokens)):
        p = int(prompt_lengths[r])
        assert torch.equal(out.tokens[r, :p], tokens[r, :p])
    erased = lm.erased()
    assert torch.equal(out.queries, generated + erased)
    assert bool((erased >= out.backtracks).all()) and bool((erased <= out.backtracks * stride).all())
    assert bool((out.queries - generated <= quota * stride).all())
    if stride == 1:
        assert torch.equal(out.queries, generated + out.backtracks)
    assert bool((out.verifier_calls >= out.backtracks).all())
    if which == "hub":  # backtracking with an exact verifier beats plain sampling on the shifted prompts
        plain = generate(lm, tokens, prompt_lengths, max_length, generator=torch.Generator().manual_seed(0))
        assert float(grammar.accept(out.tokens, out.lengths).float().mean()) > float(
            grammar.accept(plain.tokens, plain.lengths).float().mean()
        )


def test_tokenwise_rejection_with_large_quota_is_accurate_on_the_hub_lm(hub, shifted) -> None:
    """Check that stride 1 with a large quota and the exact verifier makes the hub LM's completions nearly all valid."""
    lm, grammar = CachedLM(hub.lm), hub.grammar
    tokens, prompt_lengths = (t[:100] for t in shifted)

    def accuracy(out) -> float:
        return float(grammar.accept(out.tokens, out.lengths).float().mean())

    plain = generate(lm, tokens, prompt_lengths, 26, generator=torch.Generator().manual_seed(0))
    tokenwise = generate(
        lm,
        tokens,
        prompt_lengths,
        26,
        hub.exact_verifier,
        quota=32,
        stride=1,
        generator=torch.Generator().manual_seed(0),
    )
    repeat = generate(
        lm,
        tokens,
        prompt_lengths,
        26,
        hub.exact_verifier,
        quota=32,
        stride=1,
        forbid_repeat=False,
        final_check=True,
        generator=torch.Generator().manual_seed(0),
    )
    assert accuracy(plain) <= 0.9
    assert accuracy(tokenwise) >= 0.95 and accuracy(tokenwise) > accuracy(plain)
    assert accuracy(repeat) >= 0.99


def test_forbid_repeat_blocks_a_second_backtrack_from_the_same_prefix() -> None:
    """Check that with forbid_repeat a prefix flagged again after a greedy redo is backtracked once, else Q times."""
    grammar = DyckGrammar(length=8, max_depth=4)
    lm = CachedLM(random_lm(10, seed=2))
    tokens, prompt_lengths = dyck_prompts(grammar, 8, 2, 2, seed=4)  # P = 3
    greedy = generate(lm, tokens, prompt_lengths, 10, temperature=0)
    bad = greedy.tokens[:, :6]  # the greedy prefix of 6 tokens is always flagged

    def verifier(t, lengths, hidden):
        return ((lengths == 6) & (t[:, :6] == bad).all(1)).float()

    for forbid, backtracks in ((True, 1), (False, 5)):
        out = generate(lm, tokens, prompt_lengths, 10, verifier, quota=5, stride=2, temperature=0, forbid_repeat=forbid)
        assert out.backtracks.tolist() == [backtracks] * 8
        assert torch.equal(out.queries, 7 + 2 * out.backtracks)  # 7 kept tokens + 2 erased per backtrack
        assert torch.equal(out.tokens, greedy.tokens)


def _last_token_lm(wrong_logit: float) -> FullSequenceLM:
    """A fake LM for length-4 Dyck strings: certain of ``B()()`` and, at the last position, prefers "]" to EOS."""
    target = torch.tensor([BOS, 3, 4, 3, 4, EOS])
    table = torch.full((6, VOCAB), -1e4)
    table[torch.arange(5), target[1:]] = 10.0
    table[4] = -1e4
    table[4, EOS], table[4, 6] = 0.0, wrong_logit

    def fn(tokens: torch.Tensor) -> torch.Tensor:
        return table[: tokens.shape[1]].expand(len(tokens), -1, -1)

    return FullSequenceLM(fn)


def test_final_check_fixes_an_error_in_the_last_token() -> None:
    """Check that only final_check verifies the last token: it fixes a wrong final closer that the default keeps."""
    grammar = DyckGrammar(length=4, max_depth=4)
    lm = _last_token_lm(1.0)
    tokens, prompt_lengths = encode(["B("] * 64)

    def run(**kwargs):
        return generate(
            lm,
            tokens,
            prompt_lengths,
            6,
            exact(grammar),
            quota=30,
            stride=1,
            generator=torch.Generator().manual_seed(0),
            **kwargs,
        )

    default = run(forbid_repeat=False)
    fixed = run(forbid_repeat=False, final_check=True)
    once = run(final_check=True)  # forbid_repeat: the same wrong string is never backtracked twice
    assert bool((default.tokens[:, :5] == torch.tensor([BOS, 3, 4, 3, 4])).all())
    assert 0.05 < float(grammar.accept(default.tokens, default.lengths).float().mean()) < 0.6
    assert int(default.backtracks.sum()) == 0
    assert bool(grammar.accept(fixed.tokens, fixed.lengths).all())
    assert int(fixed.backtracks.sum()) > 0 and torch.equal(fixed.queries, 4 + fixed.backtracks)
    assert int(once.backtracks.max()) == 1
    assert float(grammar.accept(once.tokens, once.lengths).float().mean()) < 1.0


def test_redo_argmax_makes_the_tokens_after_a_backtrack_greedy() -> None:
    """Check that redo_argmax decodes the erased window greedily and then sampling resumes, at the same query cost."""
    logits = torch.zeros(VOCAB)
    logits[3] = 0.5  # argmax "(" but sampling is nearly uniform

    def fn(tokens: torch.Tensor) -> torch.Tensor:
        return logits.expand(*tokens.shape, VOCAB)

    lm = FullSequenceLM(fn)
    tokens, prompt_lengths = encode(["B"] * 32)

    def verifier(t, lengths, hidden):
        return (lengths == 5).float()  # flag every row after its 4th token

    for redo in (True, False):
        out = generate(
            lm,
            tokens,
            prompt_lengths,
            9,
            verifier,
            quota=1,
            stride=4,
            redo_argmax=redo,
            forbid_repeat=False,
            generator=torch.Generator().manual_seed(0),
        )
        assert out.backtracks.tolist() == [1] * 32 and out.queries.tolist() == [12] * 32
        window_greedy = bool((out.tokens[:, 1:5] == 3).all())
        assert window_greedy is redo
        assert not bool((out.tokens[:, 5:9] == 3).all())


def test_same_seed_is_deterministic_and_temperature_zero_is_greedy(hub, shifted) -> None:
    """Check that a seeded generator reproduces outputs, another seed changes them, and temperature 0 is argmax."""
    lm = CachedLM(hub.lm)
    tokens, prompt_lengths = (t[:64] for t in shifted)

    def run(seed: int, **kwargs):
        return generate(
            lm, tokens, prompt_lengths, 26, hub.exact_verifier, generator=torch.Generator().manual_seed(seed), **kwargs
        )

    a, b, c = run(0), run(0), run(1)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.queries, b.queries)
    assert torch.equal(a.backtracks, b.backtracks)
    assert not torch.equal(a.tokens, c.tokens)
    model = random_lm(10, seed=5)
    grammar = DyckGrammar(length=8, max_depth=4)
    prompts, plens = dyck_prompts(grammar, 6, 1, 4, seed=2)
    greedy = generate(CachedLM(model), prompts, plens, 10, temperature=0)
    with torch.no_grad():
        for r in range(6):
            seq = prompts[r : r + 1, : int(plens[r])]
            while seq.shape[1] < 10:
                seq = torch.cat([seq, model(seq)[0][:, -1].argmax(-1, keepdim=True)], 1)
            assert torch.equal(greedy.tokens[r], seq[0])
    scores = torch.tensor([[0.0, 3.0, 1.0, 2.0, 0.0, 0.0, 0.0]]).expand(200, -1)
    assert bool((draw(scores, temperature=0) == 1).all())
    assert bool((draw(scores, top_p=0.5, generator=torch.Generator().manual_seed(0)) == 1).all())
    sampled = draw(scores, generator=torch.Generator().manual_seed(0))
    assert len(set(sampled.tolist())) > 2


def test_eos_stops_rows_for_good() -> None:
    """Check that with eos every sampler ends a row at its first generated EOS, never resuming after it."""
    grammar = DyckGrammar(length=8, max_depth=4)
    lm = CachedLM(random_lm(10))
    tokens, prompt_lengths = dyck_prompts(grammar, 64, 0, 2, seed=3)
    runs = {
        "plain": lambda g: generate(lm, tokens, prompt_lengths, 10, eos=EOS, generator=g),
        "backtrack": lambda g: generate(
            lm, tokens, prompt_lengths, 10, exact(grammar), quota=2, stride=1, final_check=True, eos=EOS, generator=g
        ),
        "best_of_n": lambda g: block_best_of_n(
            lm, tokens, prompt_lengths, 10, exact(grammar), 3, 2, eos=EOS, generator=g
        ),
    }
    for name, run in runs.items():
        out = run(torch.Generator().manual_seed(0))
        ended = 0
        for r in range(64):
            p, n = int(prompt_lengths[r]), int(out.lengths[r])
            completion = out.tokens[r, p:n].tolist()
            assert EOS not in completion[:-1], name
            assert n == 10 or completion[-1] == EOS, name
            ended += n < 10
        assert ended > 5, name
        generated = out.lengths - prompt_lengths
        if name == "plain":
            assert torch.equal(out.queries, generated)
        assert bool((out.queries >= generated).all()), name


# ------------------------------------------------------------------------------------------------------ bad input
def test_bad_inputs_raise_clear_errors() -> None:
    """Check empty prompts, prompts filling max_length, out-of-vocabulary or float tokens and rejected prompts raise."""
    grammar = DyckGrammar(length=8, max_depth=4)
    model = random_lm(10)
    lm = CachedLM(model)
    tokens, lengths = encode(["B((", "B()"], width=10)
    with pytest.raises(ValueError, match="empty prompt"):
        generate(lm, tokens, torch.tensor([0, 3]), 10)
    with pytest.raises(ValueError, match="no room before max_length"):
        generate(lm, tokens, torch.tensor([3, 10]), 10)
    with pytest.raises(ValueError, match="no room before max_length"):
        generate(lm, tokens, lengths, 3)
    for bad in (7, -1):
        wrong = tokens.clone()
        wrong[1, 2] = bad
        with pytest.raises(ValueError, match=r"prompt tokens must be in \[0, 7\)"):
            generate(lm, wrong, lengths, 10)
        with pytest.raises(ValueError, match="token ids must be in"):
            model(wrong)
    with pytest.raises(TypeError, match="torch.long"):
        model(tokens.float())
    with pytest.raises(ValueError, match="longer than the LM"):
        model(torch.ones(1, 11, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\(R, P\)"):
        generate(lm, tokens[0], lengths, 10)
    bad_prompt, bad_lengths = encode(["B()", "B))"], width=10)
    with pytest.raises(ValueError, match=r"rejects the prompt itself in rows \[1\]"):
        generate(lm, bad_prompt, bad_lengths, 10, exact(grammar))


def test_always_flagging_verifier_terminates_within_the_quota() -> None:
    """Check that an always-flagging verifier raises on the prompt, or with check_prompt=False stops at the quota."""
    lm = CachedLM(random_lm(12))
    tokens, prompt_lengths = encode(["B(", "B([", "B"] * 4, width=12)
    quota, stride = 3, 4

    def always(t, lengths, hidden):
        return torch.ones(len(t))

    with pytest.raises(ValueError, match="rejects the prompt"):
        generate(lm, tokens, prompt_lengths, 12, always)
    for forbid in (True, False):
        out = generate(
            lm,
            tokens,
            prompt_lengths,
            12,
            always,
            quota=quota,
            stride=stride,
            check_prompt=False,
            forbid_repeat=forbid,
            final_check=True,
            generator=torch.Generator().manual_seed(0),
        )
        assert bool((out.lengths == 12).all()) and bool((out.backtracks <= quota).all())
        assert bool((out.queries <= (12 - prompt_lengths) + quota * stride).all())
        if not forbid:  # each backtrack erases the single token generated since the prompt
            assert out.backtracks.tolist() == [quota] * 12
            assert torch.equal(out.queries, 12 - prompt_lengths + quota)


def test_random_verifier_stand_in_flags_at_its_rate_whatever_the_prefix() -> None:
    """Check that the reproduction's uninformative verifier flags a share ``rate`` of prefixes (P(error) 0 or 1),
    independently of the hidden state, and that its seeded stream reproduces."""
    from zoo.models.backtrack_sampling.reproduce import random_verifier

    hidden = torch.cat([torch.zeros(10000, 64), torch.ones(10000, 64)])
    flags = random_verifier(0.3, torch.Generator().manual_seed(0))(None, None, hidden)
    assert set(flags.unique().tolist()) <= {0.0, 1.0}
    assert abs(float(flags.mean()) - 0.3) < 0.02
    assert abs(float(flags[:10000].mean()) - float(flags[10000:].mean())) < 0.03
    again = random_verifier(0.3, torch.Generator().manual_seed(0))(None, None, hidden)
    assert torch.equal(flags, again)


# ------------------------------------------------------------------------------------------- rejection, best-of-N
def test_rejection_sample_accounting(hub, shifted) -> None:
    """Check that rejection sampling keeps accepted rows valid and charges every attempt of a row never accepted."""
    lm, grammar = CachedLM(hub.lm), hub.grammar
    tokens, prompt_lengths = (t[:100] for t in shifted)
    completion = 26 - prompt_lengths
    out = rejection_sample(
        lm, tokens, prompt_lengths, 26, grammar.accept, max_attempts=3, generator=torch.Generator().manual_seed(0)
    )
    ok = grammar.accept(out.tokens, out.lengths)
    attempts = out.queries // completion
    assert torch.equal(out.queries, attempts * completion) and bool(((attempts >= 1) & (attempts <= 3)).all())
    assert bool(ok[attempts < 3].all())  # stopped early only when accepted
    assert bool((attempts[~ok] == 3).all())
    assert bool((attempts > 1).any()) and float(ok.float().mean()) > 0.9
    never = rejection_sample(
        lm,
        tokens[:8],
        prompt_lengths[:8],
        26,
        lambda t, n: torch.zeros(len(t), dtype=torch.bool),
        max_attempts=4,
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.equal(never.queries, 4 * completion[:8])
    with pytest.raises(ValueError, match="max_attempts"):
        rejection_sample(lm, tokens, prompt_lengths, 26, grammar.accept, max_attempts=0)


def test_block_best_of_n_completes_rows_and_beats_plain(hub, shifted) -> None:
    """Check that block best-of-N fills every row, charges n × generated tokens and is at least plain's accuracy."""
    lm, grammar = CachedLM(hub.lm), hub.grammar
    tokens, prompt_lengths = (t[:100] for t in shifted)
    out = block_best_of_n(
        lm, tokens, prompt_lengths, 26, hub.exact_verifier, block=6, n=4, generator=torch.Generator().manual_seed(0)
    )
    plain = generate(lm, tokens, prompt_lengths, 26, generator=torch.Generator().manual_seed(0))
    assert bool((out.lengths == 26).all()) and torch.equal(out.queries, 4 * (26 - prompt_lengths))
    for r in range(len(tokens)):
        p = int(prompt_lengths[r])
        assert torch.equal(out.tokens[r, :p], tokens[r, :p])
    best = float(grammar.accept(out.tokens, out.lengths).float().mean())
    assert best >= float(grammar.accept(plain.tokens, plain.lengths).float().mean()) and best >= 0.9
    with pytest.raises(ValueError, match="block and n"):
        block_best_of_n(lm, tokens, prompt_lengths, 26, hub.exact_verifier, n=0)


# ----------------------------------------------------------------------------------------------- Hugging Face path
def test_hf_adapter_matches_unpadded_forward_and_runs_the_samplers() -> None:
    """Check HFCausalLM's padded logits equal per-row forwards and a GPT-2 runs backtracking and block best-of-N."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=7, n_positions=32, n_embd=32, n_layer=2, n_head=2)).eval()
    lm = HFCausalLM(model)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (5, 12), generator=g)
    lengths = torch.tensor([1, 4, 12, 7, 9])
    logits, hidden = lm(tokens, lengths)
    assert logits.shape == (5, VOCAB) and hidden.shape == (5, 32)
    with torch.no_grad():
        for r in range(5):
            ref = model(input_ids=tokens[r : r + 1, : int(lengths[r])], output_hidden_states=True)
            torch.testing.assert_close(logits[r], ref.logits[0, -1], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(hidden[r], ref.hidden_states[-1][0, -1], atol=1e-5, rtol=1e-5)
    grammar = DyckGrammar(length=8, max_depth=4)
    prompts, plens = dyck_prompts(grammar, 12, 0, 4, seed=5)
    out = generate(
        lm, prompts, plens, 10, exact(grammar), quota=4, stride=2, generator=torch.Generator().manual_seed(0)
    )
    assert bool((out.lengths == 10).all()) and bool((out.backtracks <= 4).all()) and int(out.backtracks.sum()) > 0
    assert bool((out.queries >= 10 - plens).all()) and bool((out.queries - (10 - plens) <= 8).all())
    assert all(torch.equal(out.tokens[r, : int(plens[r])], prompts[r, : int(plens[r])]) for r in range(12))
    bon = block_best_of_n(
        lm, prompts, plens, 10, exact(grammar), block=3, n=2, generator=torch.Generator().manual_seed(0)
    )
    assert bool((bon.lengths == 10).all()) and torch.equal(bon.queries, 2 * (10 - plens))
    with pytest.raises(ValueError, match="prompt tokens must be in"):
        generate(lm, torch.full((1, 3), 7), torch.tensor([3]), 10)


# ---------------------------------------------------------------------------------------------------------- DyckLM
def test_dyck_lm_generate_methods(hub, shifted) -> None:
    """Check that every DyckLM.generate method returns full-length rows that keep the prompt; unknown ones raise."""
    tokens, prompt_lengths = (t[:16] for t in shifted)
    for method in ("plain", "backtrack", "tokenwise", "rejection", "best_of_n"):
        out = hub.generate(tokens, prompt_lengths, method, generator=torch.Generator().manual_seed(0))
        assert out.tokens.shape == (16, 26) and bool((out.lengths == 26).all()), method
        assert bool((out.queries >= 26 - prompt_lengths).all()), method
        assert all(torch.equal(out.tokens[r, : int(p)], tokens[r, : int(p)]) for r, p in enumerate(prompt_lengths))
    tokenwise = hub.generate(tokens, prompt_lengths, "tokenwise", generator=torch.Generator().manual_seed(0))
    assert bool((tokenwise.queries - (26 - prompt_lengths) == tokenwise.backtracks).all())  # stride 1
    with pytest.raises(ValueError, match="unknown method"):
        hub.generate(tokens, prompt_lengths, "beam")


def test_dyck_lm_test_metrics_report_plain_and_backtrack_accuracy(hub) -> None:
    """Check that DyckLM's test loop logs plain and backtracking accuracy, with backtracking at least plain."""
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        limit_test_batches=2,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    metrics = trainer.test(hub, datamodule=DyckDataModule(train_size=64), verbose=False)[0]
    assert {"test/plain_accuracy", "test/backtrack_accuracy", "test/closing_accuracy", "test/loss"} <= set(metrics)
    assert metrics["test/backtrack_accuracy"] >= metrics["test/plain_accuracy"]
    assert metrics["test/backtrack_accuracy"] >= 0.9 and metrics["test/closing_accuracy"] > 0.8


# --------------------------------------------------------------------------------------------------- VerifierProbe
def test_probe_class_balanced_loss_weights() -> None:
    """Check the balanced loss equals plain CE on balanced labels and weights classes by N / (2 · count) otherwise."""
    torch.manual_seed(0)
    probe = VerifierProbe(d_model=4)
    plain_probe = VerifierProbe(d_model=4, balanced=False)
    plain_probe.load_state_dict(probe.state_dict())
    hidden = torch.randn(4, 4)
    ce = torch.nn.functional.cross_entropy
    balanced_labels = torch.tensor([0, 1, 0, 1])
    loss, logits = probe.loss((hidden, balanced_labels))
    torch.testing.assert_close(loss, ce(logits, balanced_labels))
    rare = torch.tensor([0, 0, 0, 1])
    loss, logits = probe.loss((hidden, rare))
    per_row = ce(logits, rare, reduction="none")
    w = torch.tensor([4 / 6, 4 / 2])[rare]  # weights 2/3 for the 3 negatives, 2 for the single positive
    torch.testing.assert_close(loss, (w * per_row).sum() / w.sum())
    assert float(w[rare == 1].sum()) == pytest.approx(float(w[rare == 0].sum()))
    assert not torch.isclose(loss, ce(logits, rare))
    torch.testing.assert_close(plain_probe.loss((hidden, rare))[0], ce(logits, rare))
    with pytest.raises(ValueError, match=r"expected hidden states \(B, 4\)"):
        probe(torch.randn(3, 5))
    with pytest.raises(ValueError, match="expected hidden states"):
        probe.verifier(None, None, torch.randn(4))


def test_hub_probe_flags_error_prefixes_more_than_valid_ones(hub_probe, pairs) -> None:
    """Check that the hub probe's P(error) lies in [0, 1] and is higher on first-error prefixes than on valid ones."""
    hidden, labels, _, _ = pairs
    p_error = hub_probe.verifier(None, None, hidden)
    assert p_error.shape == labels.shape and bool(((p_error >= 0) & (p_error <= 1)).all())
    assert float(p_error[labels == 1].mean()) > float(p_error[labels == 0].mean()) + 0.1


# ---------------------------------------------------------------------------------------------------- datamodules
def test_dyck_datamodule_batches_splits_and_bad_arguments() -> None:
    """Check DyckDataModule batches, prompt-length range, the shifted test split and invalid arguments."""
    dm = DyckDataModule(train_size=256, val_size=64, test_size=300, batch_size=32, prompt_min=3, prompt_max=9)
    dm.setup("fit")
    tokens, prompt_lengths = next(iter(dm.train_dataloader()))
    assert tokens.shape == (32, 26) and prompt_lengths.shape == (32,)
    grammar = DyckGrammar(24, 8)
    for split in (dm.train_set, dm.val_set, dm.test_set):
        x, p = split.tensors
        assert bool(grammar.accept(x, torch.full((len(x),), 26)).all())
        assert int(p.min()) >= 1 + 3 and int(p.max()) <= 1 + 9 and int(p.max()) > int(p.min())
    assert abs(opener_share(dm.test_set.tensors[0]) - 0.8) < 0.03
    assert abs(opener_share(dm.train_set.tensors[0]) - 0.2) < 0.04
    again = DyckDataModule(train_size=256, val_size=64, test_size=300, batch_size=32, prompt_min=3, prompt_max=9)
    again.setup("test")
    assert torch.equal(again.test_set.tensors[0], dm.test_set.tensors[0])
    for kwargs in ({"prompt_min": 0}, {"prompt_min": 5, "prompt_max": 4}, {"prompt_max": 24}):
        with pytest.raises(ValueError, match="prompt_min"):
            DyckDataModule(**kwargs)
    with pytest.raises(ValueError, match="one length"):
        TensorBatches(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="one length"):
        TensorBatches()


def test_error_pairs_are_first_errors_and_valid_prefixes(hub, pairs) -> None:
    """Check error_pairs positives end at the first error, negatives are valid, and hidden states match the LM."""
    hidden, labels, rows, lengths = pairs
    grammar = hub.grammar
    pos, neg = labels == 1, labels == 0
    assert int(pos.sum()) > 10 and int(neg.sum()) > 100
    ok = grammar.accept_prefix(rows, lengths)
    assert not bool(ok[pos].any()) and bool(ok[neg].all())
    assert bool(grammar.accept_prefix(rows[pos], lengths[pos] - 1).all())
    _, ref_hidden = CachedLM(hub.lm)(rows, lengths)
    torch.testing.assert_close(hidden, ref_hidden, atol=1e-5, rtol=1e-5)



def test_prefix_key_packs_hash_and_length_one_to_one() -> None:
    """Check that two prefixes whose (hash, length) pairs differ get different keys when a length reaches 64.

    A (length 65) hashes to h and B (length 1) to h + 1: the old ``hash * 64 + length`` gave both h·64 + 65.
    """
    from zoo.models.backtrack_sampling.samplers import _HASH_MOD, _prefix_hash

    width = 70
    h = (1 + pow(8191, 64, _HASH_MOD)) % _HASH_MOD  # tokens 0 at positions 0 and 64; p − 1 in between adds 0
    a = torch.zeros(width, dtype=torch.long)
    a[1:64] = _HASH_MOD - 1
    b = torch.zeros(width, dtype=torch.long)
    b[0] = h  # (h + 1) · 8191⁰
    keys = _prefix_hash(torch.stack([a, b]), torch.tensor([65, 1]))
    assert (h * 64 + 65) == ((h + 1) * 64 + 1)  # the collision of the old packing
    assert int(keys[0]) != int(keys[1])
    # Equal prefixes agree, whatever lies past their length.
    c = a.clone()
    c[65:] = 3
    assert int(_prefix_hash(c[None], torch.tensor([65]))) == int(keys[0])
