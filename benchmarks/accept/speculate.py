"""Greedy MTP speculative decoding (num-steps 3, topk 1, 4 draft tokens), simulated exactly.

What sglang 0.5.23's EAGLE worker does for a Qwen3.5 MTP draft, per verification step, with
``n`` committed tokens ``x_0..x_{n-1}`` (the last one the target's bonus token):

1. draft extend: MTP rows ``t = 0..n-2`` read ``(x_{t+1}, h_t)`` (``h`` = the target's hidden
   states after its final norm); row ``n-2`` gives draft ``d1`` (for ``x_n``);
2. draft step 2: one more row, ``(d1, g_{n-2})`` where ``g`` is the MTP's own normed output,
   attending to the extend rows' KV cache; it gives ``d2``;
3. draft step 3: ``(d2, g2_{n-1})``, attending to the extend rows and step 2; it gives ``d3``;
4. the target verifies ``[x_{n-1}, d1, d2, d3]``: draft ``k`` is accepted while it equals the
   target's argmax; the target adds its own next token (the bonus). accept length = accepted
   drafts + 1, as sglang reports it (``1 + spec_num_correct_drafts / spec_verify_ct``).

Why the target runs once per prompt and not once per step: with greedy verification every
accepted draft IS the target's greedy token, so every prefix the target ever verifies is a
prefix of the target's own greedy continuation. The target's verdicts are therefore read
from one forward pass over that continuation (``TargetRun``); its self-consistency is checked
(each generated token must be the argmax of that pass) and a prompt is only scored up to its
first inconsistency. ``one_cycle`` below runs the same cycle literally (a separate target
verification forward) and ``cross_check`` compares the two.

Why the draft runs three passes and not one per step: step ``k`` for EVERY possible start
``n`` is computed at once by giving the MTP layer the rows of all steps side by side with a
block attention mask that lets each row see exactly the KV cache sglang's would hold
(``step_mask``). Only the draft's own states are fed back; nothing is teacher-forced except
what acceptance implies (a step-2 row is only used when ``d1`` was accepted, so its input
token is the target's token).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .model import MtpHead

NUM_STEPS = 3  # --speculative-num-steps 3, --speculative-eagle-topk 1, 4 draft tokens


@dataclass
class SpecStats:
    """Verification outcomes: ``histogram[a]`` = verify steps that accepted ``a`` drafts."""

    histogram: list[int] = field(default_factory=lambda: [0] * (NUM_STEPS + 1))
    generated: int = 0

    @property
    def verify_steps(self) -> int:
        return sum(self.histogram)

    @property
    def accepted(self) -> int:
        return sum(a * c for a, c in enumerate(self.histogram))

    @property
    def accept_length(self) -> float:
        return 1 + self.accepted / max(1, self.verify_steps)

    @property
    def accept_rate(self) -> float:
        return self.accepted / max(1, self.verify_steps * NUM_STEPS)

    def reached(self, position: int) -> float:
        """Share of verify steps whose draft ``position`` (1-based) was accepted."""
        return sum(self.histogram[position:]) / max(1, self.verify_steps)

    def conditional(self, position: int) -> float:
        """P(draft ``position`` accepted | every earlier draft accepted)."""
        before = sum(self.histogram[position - 1 :])
        return sum(self.histogram[position:]) / max(1, before)


@dataclass
class Target:
    """The target's forward pieces (a transformers ``Qwen3_5ForCausalLM``, fp32, eval)."""

    model: torch.nn.Module

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.model.embed_tokens(tokens)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden)

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.model(input_ids=tokens, use_cache=False).last_hidden_state


@dataclass
class TargetRun:
    """Prompts, the target's greedy continuations, and one forward pass over them."""

    tokens: torch.Tensor  # (B, L)
    hidden: torch.Tensor  # (B, L, H), after the final norm
    prompt_len: int
    consistent_until: torch.Tensor  # (B,): tokens[..., : until + 1] are all target-greedy
    inconsistent_prompts: int


@torch.no_grad()
def target_greedy(target: Target, prompts: torch.Tensor, new_tokens: int) -> TargetRun:
    """Greedy continuations (KV/state cache, one token per step), then one full forward."""
    out = target.model(input_ids=prompts, use_cache=True)
    cache = out.past_key_values
    step_tokens = out.logits[:, -1].argmax(-1, keepdim=True)
    pieces = [prompts, step_tokens]
    for _ in range(new_tokens - 1):
        out = target.model(input_ids=step_tokens, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        step_tokens = out.logits[:, -1].argmax(-1, keepdim=True)
        pieces.append(step_tokens)
    tokens = torch.cat(pieces, dim=1)
    hidden = target.hidden(tokens)
    greedy = target.lm_head(hidden).argmax(-1)
    prompt_len = prompts.shape[1]
    # position t+1 is target-greedy when tokens[t+1] == argmax at t, for every generated t
    ok = tokens[:, prompt_len:] == greedy[:, prompt_len - 1 : -1]
    first_bad = torch.where(ok.all(1), ok.shape[1], (~ok).float().argmax(1))
    until = prompt_len - 1 + first_bad
    return TargetRun(tokens, hidden, prompt_len, until, int((~ok.all(1)).sum()))


def step_mask(rows: int, levels: int) -> torch.Tensor:
    """(levels*rows)^2 bool mask: which row of which draft step sees which KV entry.

    Level 1 = extend rows (causal). Level ``k`` row ``r`` is draft step ``k`` of the cycle
    whose extend ended at row ``r-k+1``: it sees extend rows ``<= r-k+1`` and level ``j``
    row ``r-k+j`` for ``j = 2..k`` (the earlier steps of its own cycle, and itself).
    """
    size = levels * rows
    mask = torch.zeros(size, size, dtype=torch.bool)
    r = torch.arange(rows)
    for k in range(1, levels + 1):
        q = (k - 1) * rows + r
        last_extend = r - k + 1
        cols = torch.arange(rows)
        mask[q[:, None], cols[None, :]] = cols[None, :] <= last_extend[:, None]
        for j in range(2, k + 1):
            src = r - k + j
            valid = src >= 0
            mask[q[valid], (j - 1) * rows + src[valid]] = True
    return mask


@torch.no_grad()
def draft_predictions(target: Target, mtp: MtpHead, run: TargetRun) -> list[torch.Tensor]:
    """Draft tokens of every step for every cycle start: ``preds[k-1][b, r]`` predicts x_{r+2}.

    Step ``k`` rows read token ``x_{r+1}`` (= the accepted draft ``d_{k-1}`` whenever the
    row is used) and the previous step's MTP output at row ``r-1``.
    """
    tokens, hidden = run.tokens, run.hidden
    batch, length = tokens.shape
    rows = length - 1
    token_embeds = target.embed(tokens[:, 1:])
    positions = torch.arange(rows).expand(batch, rows)
    inputs_hidden = [hidden[:, :-1]]
    outputs: list[torch.Tensor] = []
    full_mask = step_mask(rows, NUM_STEPS)
    for level in range(1, NUM_STEPS + 1):
        size = level * rows
        mask = full_mask[:size, :size].expand(batch, 1, size, size)
        out = mtp(
            token_embeds.repeat(1, level, 1),
            torch.cat(inputs_hidden, dim=1),
            position_ids=positions.repeat(1, level),
            attention_mask=mask,
        )
        level_out = out[:, (level - 1) * rows :]
        outputs.append(level_out)
        shifted = torch.zeros_like(level_out)
        shifted[:, 1:] = level_out[:, :-1]  # step k+1 at row r reads step k's output at r-1
        inputs_hidden.append(shifted)
    return [target.lm_head(o).argmax(-1) for o in outputs]


def accepted_at(preds: list[list[int]], tokens: list[int], n: int) -> int:
    """Drafts accepted by the cycle that starts with ``n`` committed tokens (one prompt).

    Draft ``k`` comes from step ``k``'s row ``n + k - 3`` and must equal ``x_{n+k-1}``.
    """
    accepted = 0
    for k in range(1, NUM_STEPS + 1):
        if preds[k - 1][n + k - 3] != tokens[n + k - 1]:
            break
        accepted += 1
    return accepted


def simulate(target: Target, mtp: MtpHead, run: TargetRun, new_tokens: int) -> SpecStats:
    """Walk every prompt's decoding, verification step by verification step."""
    preds = [p.tolist() for p in draft_predictions(target, mtp, run)]
    tokens = run.tokens.tolist()
    stats = SpecStats()
    p = run.prompt_len
    for b in range(len(tokens)):
        n = p + 1  # the prompt plus the prefill's token
        limit = int(run.consistent_until[b])
        while n - p < new_tokens and n + NUM_STEPS - 1 <= limit:
            accepted = accepted_at([level[b] for level in preds], tokens[b], n)
            stats.histogram[accepted] += 1
            n += accepted + 1
        stats.generated += n - p
    return stats


@torch.no_grad()
def one_cycle(target: Target, mtp: MtpHead, prefixes: torch.Tensor) -> list[int]:
    """One literal cycle per prefix (same length): prefill, draft 3 steps, target verifies.

    Returns the number of accepted drafts per prefix.
    """
    hidden = target.hidden(prefixes)
    bonus = target.lm_head(hidden[:, -1]).argmax(-1, keepdim=True)
    committed = torch.cat([prefixes, bonus], dim=1)
    rows_tok = target.embed(committed[:, 1:])
    rows_hid = hidden
    drafts = []
    for _step in range(NUM_STEPS):
        out = mtp(rows_tok, rows_hid)
        draft = target.lm_head(out[:, -1]).argmax(-1, keepdim=True)
        drafts.append(draft)
        rows_tok = torch.cat([rows_tok, target.embed(draft)], dim=1)
        rows_hid = torch.cat([rows_hid, out[:, -1:]], dim=1)
    drafts_t = torch.cat(drafts, dim=1)
    verify = target.lm_head(target.hidden(torch.cat([committed, drafts_t], dim=1)))
    start = prefixes.shape[1]  # logits at the bonus position predict d1
    target_tokens = verify[:, start : start + NUM_STEPS].argmax(-1)
    match = (target_tokens == drafts_t).long()
    return match.cumprod(dim=1).sum(dim=1).tolist()


def heldout_cycles(target: Target, mtp: MtpHead, windows: torch.Tensor, chunk: int = 64):
    """The loop-proof figure: one cycle from each window of real held-out text."""
    stats = SpecStats()
    for i in range(0, windows.shape[0], chunk):
        for accepted in one_cycle(target, mtp, windows[i : i + chunk]):
            stats.histogram[accepted] += 1
    return stats


def cross_check(target: Target, mtp: MtpHead, run: TargetRun, starts: list[int]) -> tuple[int, int]:
    """Literal cycles vs the batched simulation at the same starts: (agreeing, compared)."""
    preds = [p.tolist() for p in draft_predictions(target, mtp, run)]
    tokens = run.tokens.tolist()
    agree = compared = 0
    for n in starts:
        rows = [
            b
            for b in range(run.tokens.shape[0])
            if n + NUM_STEPS - 1 <= int(run.consistent_until[b])
        ]
        if not rows:
            continue
        literal = one_cycle(target, mtp, run.tokens[rows, : n - 1])
        for b, a in zip(rows, literal, strict=True):
            compared += 1
            agree += int(a == accepted_at([level[b] for level in preds], tokens[b], n))
    return agree, compared


def distinct_ngrams(run: TargetRun, n: int = 8) -> float:
    """Share of distinct byte n-grams in the continuations: near 0 means loops."""
    total = distinct = 0
    for row in run.tokens[:, run.prompt_len :].tolist():
        grams = [tuple(row[i : i + n]) for i in range(len(row) - n + 1)]
        total += len(grams)
        distinct += len(set(grams))
    return distinct / max(1, total)
