"""Greedy ``/generate`` requests to a running sglang server, and sglang's own figures back.

Usage::

    result = generate(server.url, prompt_ids, max_new_tokens=32)
    result.output_ids, result.meta["spec_verify_ct"], result.meta["spec_accept_length"]

The server runs with ``--skip-tokenizer-init``: prompts go in as token ids and come back as
``output_ids``. Everything about acceptance is read from the response's ``meta_info`` as
sglang computed it (``completion_tokens``, ``spec_verify_ct``, ``spec_accept_length``,
``spec_accept_rate``, ``spec_num_correct_drafts``, ``spec_num_proposed_drafts``); nothing is
recomputed here.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

#: meta_info keys a speculative run must report (sglang 0.5.23)
SPEC_KEYS = (
    "spec_verify_ct",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
)


@dataclass
class Generation:
    """One request's output ids, sglang's meta_info, and its wall time."""

    output_ids: list[int]
    meta: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def generate(
    url: str,
    prompt_ids: list[int],
    max_new_tokens: int,
    timeout: float = 1800.0,
    top_logprobs: int = 0,
):
    """One greedy request that ignores EOS (every run decodes the same number of tokens);
    with ``top_logprobs``, sglang's top log-probabilities of each step come back in
    ``meta["output_top_logprobs"]`` (``[logprob, token id, None]`` each)."""
    body: dict[str, Any] = {
        "input_ids": prompt_ids,
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": max_new_tokens,
            "ignore_eos": True,
        },
    }
    if top_logprobs:
        body.update(return_logprob=True, top_logprobs_num=top_logprobs)
    request = urllib.request.Request(
        f"{url}/generate",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer = json.loads(response.read())
    seconds = time.perf_counter() - started
    return Generation(list(answer["output_ids"]), dict(answer.get("meta_info", {})), seconds)
