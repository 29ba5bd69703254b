"""The sampling acceptance rules on the device: fixed-shape torch ops over a (padded) verify slot.

Each rule of :mod:`repro.decoding.acceptance` at temperature > 0, on a tree whose children were
*given* (top-k, a drafter's own tree: point-mass proposals), computed for every node at once, with no
host read and no data-dependent shape (capture-safe; ``O(log depth)`` sequential steps), and the
replayed acceptance of the scale rows (:func:`replayed_accept`, temperature 0):

- ``sample_match`` (:func:`match_accept`): the target's inverse-CDF pick at every node with the
  uniform of its output position (the host's :func:`repro.decoding.sampling.position_uniform`,
  uploaded: the same tokens as AR), then the longest match, as ``StaticDecoder.accept`` does greedily.
- ``spec_sampling`` (:func:`spec_accept`): with point masses the residual after rejecting earlier
  siblings is the parent's row with their (distinct) tokens removed, so child c is accepted with
  probability ``p_c / (1 - E_c)`` (p_c: the parent's probability of c's token, 0 for a repeated token;
  E_c: the mass of the earlier siblings' distinct tokens). Every node's sibling loop is independent
  of the rest, so all run at once; the path follows the accepted children from the root.
- ``traversal`` (:func:`traversal_accept`): a parent's weight and residual after rejected children
  depend on those children's tokens alone (not on how their subtrees were rejected), so each node's
  entering weight is a function of its ancestors': in inverse odds ``b = (1 - w) / w`` it is
  ``b_c = max(0, (b_u + 1 - E_c - p_c) / p_c)``, an affine-then-max map composed down the tree by
  pointer jumping. Its weight once its own children are rejected is ``(1 - A_c) / (1 + b_c - A_c)``
  (A_c: its children's distinct mass); the walk accepts the first node in DFS post-order (children in
  index order) whose test passes, skipping subtrees entered with weight 0.

Randomness is one uniform per node for its acceptance test and one for the bonus drawn at it (each
node is tested at most once in both walks, so the draws stay independent): :func:`keyed_uniforms`, a
counter-based hash of (seed, position, node, stream) computed on the device. The host walks with those
uniforms fed in that keying (tests/decoding/test_device_acceptance.py) give the identical path and bonus.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from repro.decoding.acceptance import SpecSampling, TargetMatch, Traversal
from repro.decoding.replayed import ReplayedAcceptance
from repro.decoding.sampling import position_uniform, step_rng
from repro.tree import ancestor_matrix, first_occurrences

_MASK32 = 0xFFFFFFFF
_BIG = 1e150  # inverse odds beyond this are weight 0 for any uniform (clamped: no inf * 0)
ACCEPT, BONUS = 0, 1  # the two uniform streams of a step


class SlotView(Protocol):
    """What the rules read of a verify slot (:class:`repro.models.static.TreeSlot` has them): tokens,
    parents (-1 for the root and padding), depth (root 1), ancestor-or-self mask, first-sibling flags."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    ancestors: torch.Tensor
    first: torch.Tensor


@dataclass
class HostView:
    """A :class:`SlotView` of a host tree padded to ``size`` nodes as a slot pads it (tests, CPU)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depth: torch.Tensor
    ancestors: torch.Tensor
    first: torch.Tensor

    @classmethod
    def of(cls, tokens: list[int], parents: list[int], size: int | None = None) -> HostView:
        n = len(tokens)
        size = size or n
        tok = np.zeros(size, dtype=np.int64)
        par = np.full(size, -1, dtype=np.int64)
        tok[:n], par[:n] = tokens, parents
        anc, depth = ancestor_matrix(par)
        first = first_occurrences(par, tok)
        as_t = torch.from_numpy
        return cls(as_t(tok), as_t(par), as_t(np.asarray(depth, dtype=np.int64)), as_t(anc), as_t(first))


# ------------------------------------------------------------------------------------- randomness


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2**32`` for 32-bit ``x`` in int64 without overflow: ``c``'s 16-bit halves, each product
    under 2**48 (x c = x c_lo + 2**16 x c_hi, and only x c_hi's low 16 bits reach below 2**32)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (Wellons' lowbias32) on int64 tensors."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


_SALTS = (0x9E3779B9, 0x27D4EB2F)  # a draw's high and low hash


def _keyed_hash(key: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """32-bit hashes of (``key`` = [seed, position] int64, ``start`` = node * 4 + stream + salt), elementwise
    over ``start`` (any shape: one chain of ops for every stream and salt at once)."""
    seed, pos = key[0:1], key[1:2]
    h = _mix32(start)
    h = _mix32(h ^ (pos & _MASK32))
    h = _mix32(h ^ ((pos >> 32) & _MASK32) ^ 0x85EBCA6B)
    h = _mix32(h ^ (seed & _MASK32))
    return _mix32(h ^ ((seed >> 32) & _MASK32) ^ 0xC2B2AE35)


def keyed_uniforms_of(key: torch.Tensor, n: int, streams: tuple[int, ...]) -> torch.Tensor:
    """[len(streams), n]: :func:`keyed_uniforms` of each stream, hashed together (one chain of elementwise
    ops instead of two per stream: in a CUDA graph each op is a kernel launch)."""
    node4 = torch.arange(n, device=key.device, dtype=torch.long) * 4
    start = torch.stack([node4 + (s + salt) for s in streams for salt in _SALTS])  # no upload: capture-safe
    h = _keyed_hash(key, start).view(len(streams), 2, n)
    return ((h[:, 0] >> 5) * 67108864 + (h[:, 1] >> 6)).double() / 9007199254740992.0


def keyed_uniforms(key: torch.Tensor, n: int, stream: int) -> torch.Tensor:
    """``n`` U[0, 1) float64 draws (53 bits: 27 and 26 bits of two hashes of the whole key, each with its
    own salt) on ``key``'s device, a pure function of (``key`` = [seed, position] int64, node index,
    ``stream``): reproducible, independent across the four."""
    return keyed_uniforms_of(key, n, (stream,))[0]


@functools.lru_cache(maxsize=1 << 16)
def _position_uniform(seed: int, position: int) -> float:
    return position_uniform(seed, position)


def position_uniforms(seed: int, position: int, n: int) -> list[float]:
    """The host's sampling uniforms of output positions ``position .. position + n - 1`` (cached)."""
    return [_position_uniform(seed, position + d) for d in range(n)]


# ------------------------------------------------------------------------------------- shared parts


def target_rows(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The target's distributions [S, V] in float64 (the host rules' ``target_probs``)."""
    return torch.softmax(logits.double() / temperature, dim=-1)


def _children(view: SlotView) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(real child flags [S], parent index clamped [S], earlier-sibling matrix [S, S] as float64)."""
    rows = torch.arange(view.parents.numel(), device=view.parents.device)
    child = view.parents >= 0
    par = view.parents.clamp(min=0)
    same = (view.parents[:, None] == view.parents[None, :]) & child[:, None] & (rows[None, :] < rows[:, None])
    return child, par, same.double()


def _parent_mass(view: SlotView, rows: torch.Tensor, child: torch.Tensor, par: torch.Tensor) -> torch.Tensor:
    """p [S]: the parent's probability of each child's token; 0 for a token an earlier sibling has."""
    vocab = rows.shape[-1]
    p = rows.reshape(-1).index_select(0, par * vocab + view.tokens)
    return torch.where(child & view.first, p, 0.0)


def _deepest(ok: torch.Tensor, view: SlotView) -> torch.Tensor:
    """[1]: the deepest node whose every ancestor-or-self is ``ok`` (node 0 must be ok)."""
    on = ~(view.ancestors & ~ok[None, :]).any(dim=-1)
    return torch.where(on, view.depth, 0).argmax().view(1)


def _draw(rows: torch.Tensor, node: torch.Tensor, view: SlotView, u: torch.Tensor) -> torch.Tensor:
    """[1]: the bonus at ``node``: its row without its children's tokens, inverse CDF with ``u`` [1]
    (the host's ``sample_index``: side right, scaled by the total)."""
    vocab = rows.shape[-1]
    row = rows.index_select(0, node)[0]
    kids = view.parents == node
    keep = torch.ones(vocab + 1, dtype=rows.dtype, device=rows.device)
    keep = keep.scatter(0, torch.where(kids, view.tokens, vocab), 0.0)[:vocab]
    cdf = torch.cumsum(row * keep, 0)
    pick = torch.searchsorted(cdf, u * cdf[-1:], right=True)
    return pick.clamp(max=vocab - 1)


# ------------------------------------------------------------------------------------------ rules


def target_picks(logits: torch.Tensor, temperature: float, u: torch.Tensor) -> torch.Tensor:
    """[S]: the target's pick at each row of ``logits`` [S, V] with its uniform ``u`` [S] (``pick_token``'s
    inverse CDF: side left, scaled by the total, clamped to V - 1)."""
    rows = target_rows(logits, temperature)
    cdf = torch.cumsum(rows, -1)
    return torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).squeeze(1).clamp(max=rows.shape[-1] - 1)


def match_accept(
    view: SlotView, logits: torch.Tensor, temperature: float, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """sample_match: (node [1], bonus [1]); ``uniforms[d]`` is the draw of the position a depth-(d+1)
    node predicts (``pick_token``'s inverse CDF: side left, scaled by the total, clamped to V - 1)."""
    choice = target_picks(logits, temperature, uniforms.index_select(0, view.depth - 1))
    child, par, _ = _children(view)
    ok = (view.tokens == choice.index_select(0, par)) & child & view.first
    ok = ok | (torch.arange(ok.numel(), device=ok.device) == 0)
    node = _deepest(ok, view)
    return node, choice.index_select(0, node)


def replayed_accept(
    view: SlotView, logits: torch.Tensor, want: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:class:`~repro.decoding.replayed.ReplayedAcceptance` at temperature 0: (node [1], bonus [1]): the
    tree's greedy spine (from the root, each node's lowest-index child) down to ``want`` [1] drafts or
    its end, and the target's argmax at that node (the host walk's last pick)."""
    child, _, same = _children(view)
    rows = torch.arange(child.numel(), device=child.device)
    ok = (child & ~(same > 0).any(dim=-1)) | (rows == 0)  # a first child, or the root
    on = ~(view.ancestors & ~ok[None, :]).any(dim=-1) & (view.depth <= want + 1)
    node = torch.where(on, view.depth, 0).argmax().view(1)
    return node, logits.index_select(0, node).argmax(dim=-1)


def spec_accept(
    view: SlotView, rows: torch.Tensor, u_accept: torch.Tensor, u_bonus: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """spec_sampling on given children: (node [1], bonus [1]); ``rows`` [S, V] the target's rows,
    ``u_accept[c]`` child c's test, ``u_bonus[u]`` the bonus draw at u."""
    child, par, earlier = _children(view)
    p = _parent_mass(view, rows, child, par)
    mass = 1.0 - earlier @ p
    prob = torch.where(p > 0, p / mass.clamp(min=1e-300), 0.0)
    passed = (u_accept < prob) & child
    taken = passed & ~((earlier > 0) & passed[None, :]).any(-1)
    ok = taken | (torch.arange(p.numel(), device=p.device) == 0)
    node = _deepest(ok, view)
    return node, _draw(rows, node, view, u_bonus.index_select(0, node))


Maps = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # x -> max(L, a x + b), per node: (L, a, b)


def _compose(outer: Maps, inner: Maps) -> Maps:
    """``x -> max(L, a x + b)`` maps: outer after inner (clamped to _BIG: no overflow to inf)."""
    lo1, a1, b1 = outer
    lo2, a2, b2 = inner
    lo = torch.maximum(lo1, a1 * lo2 + b1)
    return lo.clamp(max=_BIG), (a1 * a2).clamp(max=_BIG), (a1 * b2 + b1).clamp(max=_BIG)


def entering_odds(
    child: torch.Tensor, par: torch.Tensor, p: torch.Tensor, before: torch.Tensor
) -> torch.Tensor:
    """Traversal's entering inverse odds per node, ``b_c = max(0, (b_parent + 1 - E_c - p_c) / p_c)``
    (``before`` = E; the root level 0), composed down the tree by pointer jumping: ceil(log2(S)) rounds
    of fixed-shape ops reach the root from any depth."""
    zero = torch.zeros_like(p)
    safe = torch.where(p > 0, p, 1.0)
    a = torch.where(child, (1.0 / safe).clamp(max=_BIG), zero)
    b = torch.where(child, ((1.0 - before - p) / safe).clamp(max=_BIG), zero)
    maps, up = (zero, a, b), par
    for _ in range(max(p.numel() - 1, 0).bit_length()):
        maps = _compose(maps, tuple(m.index_select(0, up) for m in maps))  # type: ignore[arg-type]
        up = up.index_select(0, up)
    return torch.maximum(maps[0], maps[2])  # every map is constant now (a = 0 at the root level)


def traversal_accept(
    view: SlotView, rows: torch.Tensor, u_accept: torch.Tensor, u_bonus: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """traversal on given children: (node [1], bonus [1]); arguments as :func:`spec_accept`'s, with
    ``u_accept[c]`` node c's test once its children are decided (module docstring)."""
    size = view.parents.numel()
    child, par, earlier = _children(view)
    p = _parent_mass(view, rows, child, par)
    before = earlier @ p  # E_c
    kids = (view.parents[None, :] == torch.arange(size, device=p.device)[:, None]).double()
    below = kids @ p  # A_c
    odds = entering_odds(child, par, p, before)
    dead = (view.ancestors & (child & ~(p > 0))[None, :]).any(-1)
    weight = torch.where(below < 1.0, (1.0 - below) / (1.0 + odds - below).clamp(min=1e-300), 0.0)
    rows_ = torch.arange(size, device=p.device)
    passed = (u_accept < weight) | (rows_ == 0)
    candidate = passed & ~dead & view.ancestors[:, 0]
    # DFS post-order key: pre-order index - depth + subtree size (children in index order)
    sub = view.ancestors.double().sum(0)
    offset = torch.where(child, 1.0 + earlier @ sub, 0.0)
    key = view.ancestors.double() @ offset - view.depth.double() + sub
    node = torch.where(candidate, key, float(size * 4)).argmin().view(1)
    return node, _draw(rows, node, view, u_bonus.index_select(0, node))


SAMPLING_ACCEPTS: dict[type, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
    SpecSampling: spec_accept,
    Traversal: traversal_accept,
}


# ---------------------------------------------------------------------------- the engine's device rule


class DeviceRule:
    """A host rule's device twin on one device: the buffers its graphs read, ``begin`` (host writes before
    a generation: every draw it may need, no read), ``accept(slot, length)`` (capture-safe: writes
    ``slot.node`` and ``slot.bonus``) and, for sample_match AR, ``pick(logits, length)``.

    A step's draws are keyed by its root's output position, which :meth:`accept` reads on the device: the
    decoder's ``length`` (the tokens committed before the root) plus the generation's offset. So a step
    can be launched before the host knows the previous step's length (the pipelined loop), with the draws
    the host path would use: sample_match's position uniforms and the replayed depths are drawn on the host
    for every position of the generation at ``begin`` and looked up by position."""

    def __init__(self, rule: TargetMatch, device: torch.device, max_depth: int, positions: int) -> None:
        self.rule = rule
        self.kind = type(rule)
        if not has_device_rule(rule):  # greedy TargetMatch included: commit_greedy is its device path
            raise ValueError(f"no device version of {self.kind.__name__} at temperature {rule.temperature:g}")
        self.max_depth, self.positions = max_depth, positions
        self.seed = torch.full((1,), rule.seed % 2**63, dtype=torch.long, device=device)
        self.offset = torch.zeros(1, dtype=torch.long, device=device)  # root position = length + offset
        self._steps = torch.arange(max_depth, dtype=torch.long, device=device)
        replayed = self.kind is ReplayedAcceptance
        dtype = torch.long if replayed else torch.float64
        # per output position: the replayed depth drawn there, or sample_match's uniform
        self.table = torch.zeros(positions, dtype=dtype, device=device)
        self._host = torch.zeros(positions, dtype=dtype, pin_memory=device.type == "cuda")
        self._drawn: list[int] = []  # the replayed depths of this generation, on the host

    @property
    def graph_key(self) -> tuple:
        """What the graph of :meth:`accept` depends on besides the slot and strategy."""
        return ("sampling", self.kind.__name__, self.rule.temperature, id(self))

    def begin(self, prompt_len: int, max_new_tokens: int) -> None:
        """Before a generation's first step: its root positions (output position = committed length -
        ``prompt_len`` + 1) and the host's draws of its ``max_new_tokens`` positions (the previous
        generation has ended: its last read waited for the stream). A tree rooted before the end may
        reach past it: those positions decide only tokens past the end, which the engine cuts, so they
        get a fixed value (uniform 0.5, replayed depth 0), not draws (the twins are sized for the target's
        largest tree, ~1024 positions past the end: drawing them all cost AR at T = 1 ~30 ms a generation
        on an H100, 2026-12-05). Raises when they do not fit (:func:`device_rule` sizes twins)."""
        need = max_new_tokens + self.max_depth + 1  # a tree rooted before the end may reach past it
        if need > self.positions:
            raise ValueError(f"{max_new_tokens} new tokens exceed the twin's {self.positions} positions")
        self.offset.fill_(1 - prompt_len)
        if self.kind is ReplayedAcceptance:
            rule = self.rule
            assert isinstance(rule, ReplayedAcceptance)
            self._drawn = [rule.process.draw(step_rng(rule.stream, p)) for p in range(max_new_tokens)]
            self._host[:max_new_tokens] = torch.tensor(self._drawn, dtype=torch.long)
            self._host[max_new_tokens:need] = 0
        elif self.kind is TargetMatch:
            uniforms = position_uniforms(self.rule.stream, 0, max_new_tokens)
            self._host[:max_new_tokens] = torch.tensor(uniforms, dtype=torch.float64)
            self._host[max_new_tokens:need] = 0.5
        else:
            self.seed.fill_(self.rule.stream % 2**63)  # keyed_uniforms' key
            return
        self.table[:need].copy_(self._host[:need], non_blocking=True)

    def accept(self, slot: SlotView, length: torch.Tensor) -> None:
        """The rule on the slot's last verify, into ``slot.node`` and ``slot.bonus`` (capture-safe);
        ``length`` [1] the tokens committed before the slot's root (the decoder's, on the device)."""
        logits = slot.logits  # type: ignore[attr-defined]
        assert logits is not None, "verify the slot first"
        size = slot.tokens.numel()
        position = length + self.offset  # [1]: the root's output position
        last = self.positions - 1  # a step launched past the generation's end: clamped, its draws unused
        if self.kind is ReplayedAcceptance:
            want = self.table.index_select(0, position.clamp(max=last))
            node, bonus = replayed_accept(slot, logits, want)
        elif self.kind is TargetMatch:
            uniforms = self.table.index_select(0, (position + self._steps).clamp(max=last))
            node, bonus = match_accept(slot, logits, self.rule.temperature, uniforms)
        else:
            key = torch.cat([self.seed, position])
            rows = target_rows(logits, self.rule.temperature)
            u, ub = keyed_uniforms_of(key, size, (ACCEPT, BONUS))
            node, bonus = SAMPLING_ACCEPTS[self.kind](slot, rows, u, ub)
        slot.node.copy_(node)  # type: ignore[attr-defined]
        slot.bonus.copy_(bonus)  # type: ignore[attr-defined]

    def pick(self, logits: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
        """sample_match's AR pick [1] from a decode step's ``logits`` [1, V], after which ``length`` [1]
        tokens are committed (its root's included): ``TargetMatch.pick`` at the root's position, the host
        AR's token (capture-safe; ``GraphedTarget.greedy_decode``'s picker)."""
        assert self.kind is TargetMatch, "AR picks on the device under sample_match only"
        position = (length - 1 + self.offset).clamp(0, self.positions - 1)
        return target_picks(logits[-1:], self.rule.temperature, self.table.index_select(0, position))

    def done(self, path: list[int], position: int) -> None:
        """After the read of the step rooted at output ``position``: the host rule's counters (replayed:
        ``steps``, ``truncated``)."""
        if isinstance(self.rule, ReplayedAcceptance):
            self.rule.steps += 1
            self.rule.truncated += len(path) - 1 < self._drawn[position]


def device_rule(rule: TargetMatch, device: torch.device, max_depth: int, positions: int) -> DeviceRule:
    """The one :class:`DeviceRule` of ``rule`` on ``device`` with room for trees of ``max_depth`` and
    ``positions`` output positions (made again, larger, when one does not fit: its graphs are new). The
    twins are kept on the rule (``_device_twins``), so they go with it: a module-level cache keyed weakly by
    the rule kept them for good (each twin holds its rule, so the entry held its own key)."""
    per: dict[torch.device, DeviceRule] = vars(rule).setdefault("_device_twins", {})
    twin = per.get(device)
    if twin is not None:
        max_depth, positions = max(max_depth, twin.max_depth), max(positions, twin.positions)
    if twin is None or (twin.max_depth, twin.positions) != (max_depth, positions):
        twin = per[device] = DeviceRule(rule, device, max_depth, positions)
    return twin


def has_device_rule(rule: TargetMatch) -> bool:
    """Whether ``rule`` has a device version at its temperature (> 0: sampling; the replayed rule at 0)."""
    if type(rule) is ReplayedAcceptance:
        return rule.temperature <= 0
    return rule.temperature > 0 and (type(rule) is TargetMatch or type(rule) in SAMPLING_ACCEPTS)
