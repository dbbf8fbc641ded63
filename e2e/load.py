"""Requests beyond one at a time: concurrent requests, and tokens/s of two servers alternated.

Usage::

    together = concurrent(url, prompts, 32)                  # all at once, results in order
    pairing = alternated({"plugin": url_a, "float": url_b}, prompts, 32, rounds=3)
    pairing.ratio("plugin", "float")                         # median, min, max over rounds

Why alternated: the machine is shared, so tokens/s measured by two runs one after the other
compare two loads, not two servers. With both servers up, each request goes to one server and
the next to the other (the first server of each prompt rotating), so both see the same load;
each round gives one ratio, and the spread over the rounds shows what the load did.
"""

from __future__ import annotations

import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .client import Generation, generate


def concurrent(url: str, prompts: list[list[int]], new_tokens: int) -> list[Generation]:
    """Every prompt sent at once (one thread each); the generations in prompt order."""
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return list(pool.map(lambda prompt: generate(url, prompt, new_tokens), prompts))


@dataclass
class Pairing:
    """Per round and server: completion tokens, seconds, and the generations."""

    rounds: list[dict[str, dict]] = field(default_factory=list)

    def tokens_per_second(self, label: str) -> list[float]:
        return [r[label]["tokens"] / r[label]["seconds"] for r in self.rounds]

    def ratio(self, numerator: str, denominator: str) -> dict[str, float]:
        """``numerator`` tokens/s over ``denominator``'s, per round: median, min, max."""
        ratios = [
            a / b
            for a, b in zip(
                self.tokens_per_second(numerator), self.tokens_per_second(denominator), strict=True
            )
        ]
        return {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
            "rounds": ratios,
        }

    def generations(self, label: str) -> list[list[Generation]]:
        return [r[label]["generations"] for r in self.rounds]


def alternated(
    urls: dict[str, str], prompts: list[list[int]], new_tokens: int, rounds: int
) -> Pairing:
    """``rounds`` passes over ``prompts``, each prompt sent to every server in turn."""
    labels = list(urls)
    pairing = Pairing()
    for _ in range(rounds):
        figures = {label: {"tokens": 0, "seconds": 0.0, "generations": []} for label in labels}
        for index, prompt in enumerate(prompts):
            shift = index % len(labels)
            for label in labels[shift:] + labels[:shift]:
                result = generate(urls[label], prompt, new_tokens)
                figures[label]["tokens"] += int(result.meta["completion_tokens"])
                figures[label]["seconds"] += result.seconds
                figures[label]["generations"].append(result)
        pairing.rounds.append(figures)
    return pairing
