"""Weaver's Fig. 4 oracle bound: the per-depth acceptance a purely marginal drafter can reach.

A purely marginal drafter proposes depth j's token from the target's marginal p_j at depth j alone
(DFlash's per-depth marginals at best). The target's true marginals after a context are estimated
from M continuations sampled from the target at temperature 1: the first half of the samples
estimates p_j (token counts), the second half scores the drafts (so a curve is not fitted to the
samples it is scored on). Under sampling verification a chain d_1..d_d is accepted through depth d
exactly when the target's own sample starts with it (sample_match; no exact rule accepts more on a
given chain), so per depth d:

- **argmax of marginals**: d_j = argmax p_j; acceptance(d) = share of scoring samples y with
  y_1..y_d = d_1..d_d;
- **sampling from marginals**: d_j ~ p_j independently; acceptance(d) = mean over scoring samples of
  prod_{j <= d} p_j(y_j) (the exact expectation over the drafter's draws).

The bound reported is the better of the two per depth (the "pure-marginal level"); it bounds these
two marginal chain strategies, not every conceivable marginal tree. Acceptance at temperature 0 is
not bounded this way: the target's greedy continuation is deterministic, its marginals are point
masses and an argmax-of-marginal chain would reach 1 at every depth.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from repro.errors import ConfigError
from repro.harness.evaluation import greedy_continuations
from repro.models.hybrid import HybridLM


@dataclass
class MarginalBound:
    """Per depth (1 first): the two marginal drafters' acceptance, averaged over contexts."""

    contexts: int
    samples: int  # M per context (half fit the marginals, half score)
    argmax: list[float]
    sampled: list[float]

    @property
    def bound(self) -> list[float]:
        return [max(a, s) for a, s in zip(self.argmax, self.sampled)]


def context_curves(fit: torch.Tensor, score: torch.Tensor, vocab: int) -> tuple[list[float], list[float]]:
    """Per-depth acceptance (argmax of marginals, sampling from marginals) of one context, from
    continuations ``fit`` [M1, D] (estimating p_j) and ``score`` [M2, D] (the target's samples)."""
    if fit.dim() != 2 or score.dim() != 2 or fit.shape[1] != score.shape[1] or not len(fit) or not len(score):
        raise ConfigError("context_curves needs non-empty samples [M, D] of one depth D")
    depth = fit.shape[1]
    counts = torch.zeros(depth, vocab, dtype=torch.float64)
    counts.scatter_add_(1, fit.T.long(), torch.ones(fit.T.shape, dtype=torch.float64))
    marg = counts / len(fit)  # [D, V]
    top = marg.argmax(-1)  # [D]
    hit = (score == top[None]).long().cumprod(-1).double()  # [M2, D]: prefix matches the argmax chain
    prob = marg.gather(1, score.T.long()).T.cumprod(-1)  # [M2, D]: prod_j p_j(y_j)
    return hit.mean(0).tolist(), prob.mean(0).tolist()


def marginal_bound(
    target: HybridLM, contexts: list[list[int]], depth: int, samples: int, seed: int
) -> MarginalBound:
    """The oracle bound over ``contexts``: ``samples`` continuations of ``depth`` tokens sampled from
    ``target`` at temperature 1 per context (seeded), half fitting the marginals, half scoring."""
    if samples < 2 or depth < 1 or not contexts:
        raise ConfigError(f"the oracle bound needs >= 2 samples, depth >= 1 and contexts (got {samples})")
    gen = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    argmax, sampled = torch.zeros(depth, dtype=torch.float64), torch.zeros(depth, dtype=torch.float64)
    for ctx in contexts:
        seqs = greedy_continuations(target, [ctx] * samples, depth, temperature=1.0, generator=gen)
        cont = seqs[:, len(ctx) :]
        a, s = context_curves(cont[: samples // 2], cont[samples // 2 :], vocab)
        argmax += torch.tensor(a, dtype=torch.float64)
        sampled += torch.tensor(s, dtype=torch.float64)
    n = len(contexts)
    return MarginalBound(n, samples, (argmax / n).tolist(), (sampled / n).tolist())
