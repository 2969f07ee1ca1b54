"""Streaming anomaly detectors for the SEAD pool (card §2, §5, §6): plain torch, vectorised over chunks of the stream.

Every detector follows the prequential order of SEAD (card §2.4, §9): ``score(x)`` uses only the points learned so far,
then ``learn(x)`` inserts x. ``score_learn_chunk(X)`` runs that order over an ordered chunk ``(B, d)`` in a few batched
tensor ops: row b is scored by the state that has learnt rows 0..b-1 of the chunk (band masks over the window, prefix
sums and counts within the chunk), so its scores equal ``B`` calls of ``score_learn`` (tested), only without per-point
overhead. Each detector has one implementation, ``_process(X, score, learn)``; the per-point methods are its chunk of
one row. ``score_learn_many(pool, X)`` runs a whole pool, and a family whose settings can share tensor ops (LODA's
projections, RS-Hash's count-min tables) runs them as one stack through ``_process_many``, so the card's four settings
per algorithm cost about one setting's op count. The *entire* state of a detector is registered buffers (windows,
counters, histograms, trees, sums), so ``state_dict`` / safetensors checkpoint and restore a warmed-up detector exactly;
the only Python attributes are constants of the config.

The paper used the PySAD implementations (card §5); these are re-implementations from the algorithms' descriptions, not
ports, and their scores are raw (SEAD's normaliser maps them to [0, 1]).
"""

from zoo.models.sead.detectors.base import StreamDetector, score_learn_many
from zoo.models.sead.detectors.hst import HalfSpaceTrees
from zoo.models.sead.detectors.loda import LODA
from zoo.models.sead.detectors.pool import DETECTORS, build_detector, build_pool, default_pool, paper_pool
from zoo.models.sead.detectors.random_scorer import RandomScorer
from zoo.models.sead.detectors.rshash import RSHash
from zoo.models.sead.detectors.window import MADScorer, WindowKNN

__all__ = [
    "DETECTORS",
    "HalfSpaceTrees",
    "LODA",
    "MADScorer",
    "RSHash",
    "RandomScorer",
    "StreamDetector",
    "WindowKNN",
    "build_detector",
    "build_pool",
    "default_pool",
    "paper_pool",
    "score_learn_many",
]
