"""Exact acceptance of drafted tokens, vectorised over the batch.

Greedy (temperature 0): a drafted token is kept while it equals the target's argmax; the first
mismatch is replaced by the target's argmax, and when every draft matches the target's next
argmax is the bonus token. Output is token-for-token what autoregressive greedy decoding gives.

Sampled (Leviathan et al. 2023, Chen et al. 2023): drafted token d_i ~ q_i is kept with probability
min(1, p_i(d_i) / q_i(d_i)); at the first rejection the token is drawn from normalise(max(0, p_i -
q_i)); if all are kept, a bonus token is drawn from p_{K+1}. Every emitted token is then
distributed exactly as the target's p.

Rows may have drafted fewer than K tokens (`draft_lengths`); positions past a row's drafts are
rejected with q = 0 there, so the residual is p itself: the row falls back to a plain target sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.native.sampling import sample_from_probs


@dataclass
class Acceptance:
    accepted_counts: torch.Tensor  # [B] leading drafted tokens kept, 0..draft_lengths[b]
    next_tokens: torch.Tensor  # [B] the correction (after a rejection) or bonus token


def _leading_true_count(keep: torch.Tensor) -> torch.Tensor:
    return keep.long().cumprod(dim=-1).sum(dim=-1)


def _positions_drafted(draft_lengths: torch.Tensor, num_positions: int) -> torch.Tensor:
    positions = torch.arange(num_positions, device=draft_lengths.device)
    return positions[None, :] < draft_lengths[:, None]


def accept_greedy(
    draft_tokens: torch.Tensor,  # [B, K]
    draft_lengths: torch.Tensor,  # [B]
    target_logits: torch.Tensor,  # [B, K + 1, V]
) -> Acceptance:
    target_choice = target_logits.argmax(dim=-1)  # [B, K + 1]
    num_positions = draft_tokens.shape[1]
    keep = (draft_tokens == target_choice[:, :num_positions]) & _positions_drafted(
        draft_lengths, num_positions
    )
    accepted = _leading_true_count(keep)
    next_tokens = target_choice.gather(1, accepted[:, None]).squeeze(1)
    return Acceptance(accepted, next_tokens)


def accept_rejection_sampling(
    draft_tokens: torch.Tensor,  # [B, K]
    draft_lengths: torch.Tensor,  # [B]
    draft_probs: torch.Tensor | None,  # [B, K, V]; None means one-hot drafts (n-gram lookup)
    target_probs: torch.Tensor,  # [B, K + 1, V], already warped
    generator: torch.Generator | None,
) -> Acceptance:
    batch_size, num_positions = draft_tokens.shape
    rows = torch.arange(batch_size, device=draft_tokens.device)
    drafted = _positions_drafted(draft_lengths, num_positions)

    p_of_draft = target_probs[:, :num_positions].gather(-1, draft_tokens[..., None]).squeeze(-1)
    if draft_probs is None:
        q_of_draft = torch.ones_like(p_of_draft)
    else:
        q_of_draft = draft_probs.gather(-1, draft_tokens[..., None]).squeeze(-1)
    uniform = torch.rand(p_of_draft.shape, generator=generator, device=p_of_draft.device)
    keep = (uniform * q_of_draft < p_of_draft) & drafted  # u < p/q without dividing by q
    accepted = _leading_true_count(keep)

    p_next = target_probs[rows, accepted]  # [B, V]
    was_rejected = accepted < draft_lengths  # else: all drafts kept, bonus token from p
    at = accepted.clamp(max=num_positions - 1)
    if draft_probs is None:
        q_next = torch.zeros_like(p_next)
        q_next[rows, draft_tokens[rows, at]] = 1.0
    else:
        q_next = draft_probs[rows, at].float()
    q_next = q_next * was_rejected[:, None]  # bonus rows: q = 0, so the residual is p
    next_tokens = sample_from_probs(residual_distribution(p_next, q_next), generator)
    return Acceptance(accepted, next_tokens)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalise(max(0, p - q)) row-wise: what a rejected position is resampled from."""
    residual = (p - q).clamp_min(0)
    mass = residual.sum(dim=-1, keepdim=True)
    # p == q leaves no residual mass; a rejection then has probability 0, but rounding can
    # still produce one, and p is the right distribution for it.
    return torch.where(mass > 0, residual / mass.clamp_min(1e-30), p)
