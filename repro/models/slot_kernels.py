"""Triton kernels of a tree slot's bookkeeping around the verify forward (``StaticDecoder.fuse_bookkeeping``).

At small widths a speculative step is bound by its launches, not its arithmetic: on the H200 at the tiny
family's width a DDTree step ran 274 kernels, of which the slot's derived inputs (depths, ancestor mask,
conv gather index, first-sibling flags: ~30 fixed-shape torch ops in the verify graph), the greedy accept and
the accepted path (~30) and the attention rows' commit and the length's advance (~12) were small torch
kernels doing what one program does in registers (results/2026-12-03-h200-gpu-suite, call AS). Here each of
those is one launch, on the device, capturable (no host read), and equal to the torch ops it replaces
(tests/models/test_slot_kernels.py, under Triton's interpreter and on CUDA):

- :func:`derive_slot`: :meth:`~repro.models.static.TreeSlot.derive` from tokens and parents. Each program
  takes a block of rows; a row walks up its parent pointers (gathered in registers by a one-hot reduce over
  the loaded parents, no memory round trip a level) until every walk of the block has left the tree.
- :func:`copy_tree`: :meth:`~repro.models.static.TreeSlot.set_device_tree`'s copy of a device tree into the
  slot, padding included.
- :func:`greedy_node`: :meth:`~repro.models.static.StaticDecoder.accept`'s node and bonus from the nodes'
  argmax tokens: the deepest node whose path below the root matches (first on ties).
- :func:`path_result`: :meth:`~repro.models.static.StaticDecoder.accepted_path`'s ``slot.result``.
- :func:`commit_rows`: an attention layer's commit: the path's keys and values into the cache rows after
  the committed length (the off-path rows are not written; the torch commit sends them to scratch rows).
- :func:`advance_length`: the committed length plus the path's length, capped at ``max_len``.
- :func:`tagged_to_host`: a step's result into pinned host memory by the kernel's own stores, inside the
  step's graph (no stream copy and no event behind it), each element tagged from a device counter so the
  host sees when all have landed (:func:`untagged`).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from repro.gdn.triton_common import interpreting  # noqa: F401 - also patches the CPU interpreter

REGISTER_TILE = 4096  # elements of a [rows, nodes] tile a program keeps in registers
# derive_slot's launch: rows a program (None: as many as a REGISTER_TILE holds, one program up to 64 nodes)
# and warps. One row a program on one warp, from scripts/gpu/slot-bench.py on the H200
# (results/2026-12-04-h200-derive-rows/callCF, us a call at 17 / 33 / 65 nodes, chains): 1.7 / 2.7 / 4.5
# against 4.5 / 30.5 / 69.7 for one program of every row on 4 warps (the walk's one-hot reduces over a
# [rows, nodes] tile cost more the wider the tile; with one row a program the deepest row alone is serial)
DERIVE_ROWS: int | None = 1
DERIVE_WARPS = 1
# greedy_node's one program: rows a step (None: a REGISTER_TILE's worth) and warps (slot-bench times them)
GREEDY_ROWS: int | None = None
GREEDY_WARPS = 4


def _flags(t: torch.Tensor) -> torch.Tensor:
    """A bool tensor as uint8 (same bytes)."""
    return t.view(torch.uint8) if t.dtype == torch.bool else t


@triton.jit
def _gather(values, index, cols):
    """values[index] for each entry of ``index`` (-1 where index matches no column): a one-hot reduce over
    the ``cols`` [NP] entries of ``values`` held in registers."""
    hit = cols[None, :] == index[:, None]
    return tl.sum(tl.where(hit, values[None, :] + 1, 0), axis=1) - 1


@triton.jit
def _derive_kernel(
    tokens, parents, depth, anc, conv_index, first, n,
    HIST: tl.constexpr, W: tl.constexpr, NP: tl.constexpr, BR: tl.constexpr,
):  # fmt: skip
    """Rows [pid * BR, pid * BR + BR) of the derived inputs (:func:`derive_slot`)."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.arange(0, NP)
    m_r = rows < n
    m_c = cols < n
    par = tl.load(parents + cols, mask=m_c, other=-1).to(tl.int32)
    tok = tl.load(tokens + cols, mask=m_c, other=0)
    p_r = tl.load(parents + rows, mask=m_r, other=-1).to(tl.int32)
    t_r = tl.load(tokens + rows, mask=m_r, other=0)
    twin = (par[None, :] == p_r[:, None]) & (tok[None, :] == t_r[:, None]) & (cols[None, :] < rows[:, None])
    twins = tl.sum((twin & m_c[None, :]).to(tl.int32), axis=1)
    tl.store(first + rows, (twins == 0).to(tl.uint8), mask=m_r)
    # conv gather index: column r = the r-th predecessor, past the root into the history (most recent first)
    cur = tl.where(m_r, rows, -1)
    back = tl.zeros([BR], dtype=tl.int32)
    for r in tl.static_range(W):
        inside = cur >= 0
        back += tl.where(inside, 0, 1)
        col = tl.where(inside, HIST + cur, HIST - back)
        tl.store(conv_index + rows * W + r, col.to(tl.int64), mask=m_r)
        cur = tl.where(inside, _gather(par, cur, cols), cur)
    # ancestor-or-self rows: walk up until every row of the block has left the tree (at most n levels)
    cur = tl.where(m_r, rows, -1)
    a = tl.zeros([BR, NP], dtype=tl.int32)
    level = 0
    while (tl.max(cur, axis=0) >= 0) & (level < n):
        a += (cols[None, :] == cur[:, None]).to(tl.int32)
        cur = tl.where(cur >= 0, _gather(par, cur, cols), -1)
        level += 1
    tl.store(depth + rows, tl.sum(a, axis=1).to(tl.int64), mask=m_r)
    tl.store(anc + rows[:, None] * n + cols[None, :], a.to(tl.uint8), mask=m_r[:, None] & m_c[None, :])


def derive_slot(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    depth: torch.Tensor,
    ancestors: torch.Tensor,
    conv_index: torch.Tensor,
    first: torch.Tensor,
    block_rows: int | None = None,
    num_warps: int | None = None,
) -> None:
    """Depths [n] (int64), ancestor-or-self mask [n, n] (bool), conv gather index [n, W] (int64: as
    :func:`repro.gdn.reference.conv_gather_index`) and first-sibling flags [n] (bool) of the tree given by
    ``tokens`` and ``parents`` [n] (int64, parent -1 at the root level), written in place; one launch of
    ``block_rows`` rows a program (a power of two; default :data:`DERIVE_ROWS`) and ``num_warps`` warps
    (:data:`DERIVE_WARPS`). Each program walks its rows up to the root, so fewer rows a program shorten the
    deepest program's walk and its one-hot reduces."""
    n, width = conv_index.shape
    np2 = triton.next_power_of_2(n)
    br = block_rows or DERIVE_ROWS or REGISTER_TILE // np2
    br = max(1, min(np2, triton.next_power_of_2(br)))
    _derive_kernel[(triton.cdiv(n, br),)](
        tokens, parents, depth, _flags(ancestors), conv_index, _flags(first), n,
        HIST=width - 1, W=width, NP=np2, BR=br, num_warps=num_warps or DERIVE_WARPS,
    )  # fmt: skip


@triton.jit
def _copy_tree_kernel(
    tokens, parents, src_tokens, src_parents, n, size, s_t, s_p, PARENTS: tl.constexpr, BN: tl.constexpr
):  # fmt: skip
    """One program: the tree's n tokens (and parents) into the slot's first n, the rest padded (token 0,
    parent -1)."""
    i = tl.arange(0, BN)
    inside = i < n
    keep = i < size
    tl.store(tokens + i, tl.load(src_tokens + i * s_t, mask=inside, other=0), mask=keep)
    if PARENTS:
        tl.store(parents + i, tl.load(src_parents + i * s_p, mask=inside, other=-1), mask=keep)


def copy_tree(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    src_tokens: torch.Tensor,
    src_parents: torch.Tensor,
    copy_parents: bool = True,
) -> None:
    """A device tree's ``src_tokens`` / ``src_parents`` [n] (int64) into a slot's ``tokens`` / ``parents``
    [size] (n <= size), padded as :meth:`~repro.models.static.TreeSlot.set_tree` pads (token 0, parent -1);
    ``copy_parents`` False leaves the slot's parents as they are. One launch, a kernel instead of two stream
    copies (off by default: ``static.KERNEL_TREE_COPY``)."""
    size, n = tokens.shape[0], src_tokens.shape[0]
    if n > size:
        raise ValueError(f"a tree of {n} nodes does not fit a slot of {size}")
    _copy_tree_kernel[(1,)](
        tokens, parents, src_tokens, src_parents, n, size, src_tokens.stride(0), src_parents.stride(0),
        PARENTS=copy_parents, BN=triton.next_power_of_2(size), num_warps=1,
    )  # fmt: skip


@triton.jit
def _greedy_node_kernel(
    choice, tokens, parents, first, depth, anc, node, bonus, n, NP: tl.constexpr, BR: tl.constexpr
):
    """One program: the accepted node and the bonus token (:func:`greedy_node`)."""
    cols = tl.arange(0, NP)
    m_c = cols < n
    par = tl.load(parents + cols, mask=m_c, other=-1)
    tok = tl.load(tokens + cols, mask=m_c, other=0)
    fst = tl.load(first + cols, mask=m_c, other=0)
    parent_pick = tl.load(choice + tl.maximum(par, 0), mask=m_c, other=-1)
    ok = (((tok == parent_pick) & (par >= 0) & (fst != 0)) | (cols == 0)).to(tl.int32)
    best_depth = tl.zeros([], dtype=tl.int64)
    best = tl.zeros([], dtype=tl.int32)
    for r0 in range(0, n, BR):
        rows = r0 + tl.arange(0, BR)
        m_r = rows < n
        a = tl.load(anc + rows[:, None] * n + cols[None, :], mask=m_r[:, None] & m_c[None, :], other=0)
        bad = tl.sum(((a != 0) & (ok[None, :] == 0)).to(tl.int32), axis=1)  # ancestors that do not match
        score = tl.where(m_r & (bad == 0), tl.load(depth + rows, mask=m_r, other=0), 0)
        top = tl.max(score, axis=0)
        at = tl.min(tl.where(score == top, rows, n), axis=0)
        better = top > best_depth
        best = tl.where(better, at, best)
        best_depth = tl.where(better, top, best_depth)
    tl.store(node, best.to(tl.int64))
    tl.store(bonus, tl.load(choice + best))


def greedy_node(
    choice: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    first: torch.Tensor,
    depth: torch.Tensor,
    ancestors: torch.Tensor,
    node: torch.Tensor,
    bonus: torch.Tensor,
    block_rows: int | None = None,
    num_warps: int | None = None,
) -> None:
    """Greedy acceptance (TargetMatch at temperature 0) from ``choice`` [n] (each node's argmax token):
    a node is accepted when every node on its path below the root carries its parent's choice and is the
    first child of its parent with that token; ``node`` [1] = the deepest accepted node (the first on ties),
    ``bonus`` [1] = its choice. One launch, one program, walking the rows ``block_rows`` at a time (a power
    of two; default :data:`GREEDY_ROWS`) on ``num_warps`` warps (:data:`GREEDY_WARPS`)."""
    n = tokens.shape[0]
    np2 = triton.next_power_of_2(n)
    br = block_rows or GREEDY_ROWS or REGISTER_TILE // np2
    br = max(1, min(np2, triton.next_power_of_2(br)))
    _greedy_node_kernel[(1,)](
        choice, tokens, parents, _flags(first), depth, _flags(ancestors), node, bonus, n, NP=np2, BR=br,
        num_warps=num_warps or GREEDY_WARPS,
    )  # fmt: skip


@triton.jit
def _path_result_kernel(node, bonus, tokens, depth, anc, result, n, D, NP: tl.constexpr, DP: tl.constexpr):
    """One program: ``result`` (:func:`path_result`)."""
    cols = tl.arange(0, NP)
    m_c = cols < n
    end = tl.maximum(tl.load(node), 0)
    on = (tl.load(anc + end * n + cols, mask=m_c, other=0) != 0) & m_c
    dep = tl.load(depth + cols, mask=m_c, other=1)
    tok = tl.load(tokens + cols, mask=m_c, other=0)
    at = dep - 1
    length = tl.load(depth + end)
    tl.store(result + 2 + at, cols.to(tl.int64), mask=on & (at < D))
    tl.store(result + 2 + D + at, tok, mask=on & (at < D))
    pad = tl.arange(0, DP)
    m_pad = (pad >= length) & (pad < D)
    tl.store(result + 2 + pad, tl.zeros([DP], dtype=tl.int64), mask=m_pad)
    tl.store(result + 2 + D + pad, tl.zeros([DP], dtype=tl.int64) + tl.load(tokens), mask=m_pad)
    tl.store(result, length)
    tl.store(result + 1, tl.load(bonus))


def path_result(
    node: torch.Tensor,
    bonus: torch.Tensor,
    tokens: torch.Tensor,
    depth: torch.Tensor,
    ancestors: torch.Tensor,
    result: torch.Tensor,
) -> None:
    """``result`` [2 + 2 D] (int64) = [path length, bonus, the path's nodes by depth, their tokens], the
    positions past the path holding node 0 and its token, for the path from the root to ``node`` [1]. One
    launch, one program."""
    n = tokens.shape[0]
    d = (result.numel() - 2) // 2
    _path_result_kernel[(1,)](
        node, bonus, tokens, depth, _flags(ancestors), result, n, d,
        NP=triton.next_power_of_2(n), DP=triton.next_power_of_2(d), num_warps=4,
    )  # fmt: skip


@triton.jit
def _commit_rows_kernel(
    keys, values, k_src, v_src, anc, depth, node, length, n, HD,
    s_kh, s_kr, s_kn, s_kh_src, s_vn, s_vh,
    BN: tl.constexpr, HDP: tl.constexpr,
):  # fmt: skip
    """Program h: head h's keys and values of the path's nodes into rows length + depth - 1."""
    h = tl.program_id(0)
    end = tl.load(node)
    a = tl.maximum(end, 0)
    base = tl.load(length)
    d = tl.arange(0, HDP)
    m_d = d < HD
    for c0 in range(0, n, BN):
        c = c0 + tl.arange(0, BN)
        m_c = (c < n) & (end >= 0)
        on = (tl.load(anc + a * n + c, mask=m_c, other=0) != 0) & m_c
        dest = base + tl.load(depth + c, mask=m_c, other=1) - 1
        m = on[:, None] & m_d[None, :]
        out = h * s_kh + dest[:, None] * s_kr + d[None, :]
        k = tl.load(k_src + c[:, None] * s_kn + h * s_kh_src + d[None, :], mask=m, other=0.0)
        v = tl.load(v_src + c[:, None] * s_vn + h * s_vh + d[None, :], mask=m, other=0.0)
        tl.store(keys + out, k, mask=m)
        tl.store(values + out, v, mask=m)


def commit_rows(
    keys: torch.Tensor,
    values: torch.Tensor,
    k_src: torch.Tensor,
    v_src: torch.Tensor,
    ancestors: torch.Tensor,
    depth: torch.Tensor,
    node: torch.Tensor,
    length: torch.Tensor,
) -> None:
    """An attention layer's commit of the root-to-``node`` path: node j's key and value (``k_src`` /
    ``v_src`` [n, H_kv, hd], last dim contiguous) into row ``length + depth[j] - 1`` of ``keys`` / ``values``
    [H_kv, rows, hd] (contiguous); ``length`` [1] is the committed length before the path. One launch, a
    program per head."""
    n, heads, hd = k_src.shape
    if v_src.shape != k_src.shape or k_src.stride(-1) != 1 or v_src.stride(-1) != 1:
        raise ValueError("commit_rows: k_src and v_src of one shape, their last dims contiguous")
    if values.shape != keys.shape or not keys.is_contiguous() or not values.is_contiguous():
        raise ValueError("commit_rows: keys and values contiguous, of one shape")
    hdp = triton.next_power_of_2(hd)
    bn = max(1, min(triton.next_power_of_2(n), REGISTER_TILE // hdp))
    _commit_rows_kernel[(heads,)](
        keys, values, k_src, v_src, _flags(ancestors), depth, node, length, n, hd,
        keys.stride(0), keys.stride(1), *k_src.stride()[:2], *v_src.stride()[:2], BN=bn, HDP=hdp,
        num_warps=4,
    )  # fmt: skip


@triton.jit
def _advance_kernel(length, depth, node, max_len):
    end = tl.load(node)
    step = tl.where(end >= 0, tl.load(depth + tl.maximum(end, 0)), 0)
    tl.store(length, tl.minimum(tl.load(length) + step, max_len))


def advance_length(length: torch.Tensor, depth: torch.Tensor, node: torch.Tensor, max_len: int) -> None:
    """``length`` [1] += the depth of ``node`` (the committed path's length; none for node -1, as
    :func:`commit_rows` writes no row then), capped at ``max_len``; one launch."""
    _advance_kernel[(1,)](length, depth, node, max_len, num_warps=1)


TAG_BITS = 16  # tagged_to_host: an element is value << TAG_BITS | tag
TAGS = 1 << TAG_BITS
# host rows a result's stores rotate through (row = tag % TAG_ROWS): a pipelined loop reads step k while the
# device may have stored the results of the engine.PIPELINE_DEPTH steps launched after it (at most 3)
TAG_ROWS = 4
# tags run 1 .. TAG_PERIOD and wrap to 1: a period that TAG_ROWS divides, so that consecutive tags take the
# rows in turn across the wrap too, and a zeroed row (tag 0) never reads as landed
TAG_PERIOD = TAGS - TAG_ROWS


def next_tag(tag: int) -> int:
    """The tag after ``tag`` (what :func:`tagged_to_host` takes from its counter): 1 .. TAG_PERIOD, cyclic."""
    return tag % TAG_PERIOD + 1


# launched inside the step graphs (one binary at capture); outside them (graphs off) on every read, where a
# length specialization first met mid-run would compile (on an H200 greedy AR 0.116 -> 0.314 ms a token over
# 288 tokens when a Python-launched store met a new tag specialization, routes-ab callCZ)
@triton.jit(do_not_specialize=["n"], do_not_specialize_on_alignment=["src", "dst"])
def _tagged_kernel(
    src, dst, n, counter,
    TAG_BITS: tl.constexpr, PERIOD: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    tag = tl.load(counter) % PERIOD + 1
    tl.debug_barrier()  # every thread has read the counter before it is moved on
    tl.store(counter, tag)
    o = tl.arange(0, BLOCK)
    m = o < n
    tl.store(dst + (tag % ROWS) * n + o, (tl.load(src + o, mask=m, other=0) << TAG_BITS) | tag, mask=m)


def tagged_to_host(src: torch.Tensor, dst: torch.Tensor, counter: torch.Tensor) -> None:
    """``src`` [n] int64 (device) into row ``tag % TAG_ROWS`` of ``dst`` [TAG_ROWS, n] int64 (pinned host
    memory on CUDA, which the kernel stores to directly: unified addressing), each element
    ``src << TAG_BITS | tag`` in one 8-byte store, where ``tag`` = :func:`next_tag` of ``counter`` [1] (int64,
    device; written back). The host, mirroring the counter, knows the whole result has landed when every
    element of the row carries the tag (:func:`untagged`), in whatever order the stores arrive, without a
    stream copy or an event behind it; consecutive stores take the rows in turn, so TAG_ROWS - 1 more may
    land while the host still reads one. Capturable (the tag is the device's: a graph replay stores the next
    one); values within +-2**(63 - TAG_BITS)."""
    n = src.numel()
    if dst.shape != (TAG_ROWS, n) or counter.numel() != 1:
        shape = tuple(dst.shape)
        raise ValueError(f"tagged_to_host takes dst [{TAG_ROWS}, {n}] and a counter [1], got {shape}")
    _tagged_kernel[(1,)](
        src, dst, n, counter, TAG_BITS=TAG_BITS, PERIOD=TAG_PERIOD, ROWS=TAG_ROWS,
        BLOCK=triton.next_power_of_2(max(n, 16)), num_warps=1,
    )  # fmt: skip


def untagged(words: np.ndarray, tag: int) -> list[int] | None:
    """The values of ``words`` (what :func:`tagged_to_host` stores) when every one carries ``tag``, else
    None (some have not landed yet)."""
    if not bool(np.all((words & (TAGS - 1)) == tag)):
        return None
    return (words >> TAG_BITS).tolist()
