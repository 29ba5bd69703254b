"""Oracles for the pure-torch Gated DeltaNet reference (repro.gdn.reference) and draft trees.

The tree form (masked WY, one pass) is pinned to the token-by-token recurrence run separately
along every root-to-node path; the recurrence is pinned to an independent loop over a [d_k, d_v]
state and to flash-linear-attention's own naive loop. Negative controls show that the path
oracle catches the two classic tree mistakes (positional gate cumsum, causal mask).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import leaves, random_tree, seed_of, tree_depths

from repro.errors import TreeError
from repro.gdn import reference as gdn
from repro.tree import MAX_TREE_NODES, Tree

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64
# (H key heads, HV value heads, d_k, d_v): grouped value heads and d_k != d_v
HEADS = [(2, 4, 8, 6), (2, 2, 6, 10)]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def gdn_inputs(n: int, h: int, hv: int, dk: int, dv: int, gen: torch.Generator, beta_max: float = 1.0):
    """Random GDN inputs: unit q/k, g <= 0 (a mix of weak and strong decays), beta in (0, beta_max)."""
    q = F.normalize(torch.randn(n, h, dk, generator=gen, dtype=F64), dim=-1)
    k = F.normalize(torch.randn(n, h, dk, generator=gen, dtype=F64), dim=-1)
    v = torch.randn(n, hv, dv, generator=gen, dtype=F64)
    g = -torch.rand(n, hv, generator=gen, dtype=F64) * torch.rand(1, hv, generator=gen, dtype=F64).mul(
        0.8
    ).add(0.05)
    beta = beta_max * torch.rand(n, hv, generator=gen, dtype=F64).clamp(0.02, 0.98)
    s0 = torch.randn(hv, dv, dk, generator=gen, dtype=F64)
    return q, k, v, g, beta, s0


def path_oracle(q, k, v, g, beta, s0, parents: torch.Tensor, scale: float):
    """Per-node outputs [n, HV, dv] and states [n, HV, dv, dk]: recurrent_gdn along each path."""
    tree = Tree(torch.zeros_like(parents), parents)
    outs, states = [], []
    for i in range(parents.numel()):
        p = tree.path_to(i)
        o, s = gdn.recurrent_gdn(q[p], k[p], v[p], g[p], beta[p], s0, scale)
        outs.append(o[-1])
        states.append(s)
    return torch.stack(outs), torch.stack(states)


TREE_CASES = [("chain", 100), ("random", 100), ("random", 40), ("fan", 60), ("mixed", 80), ("forest", 50)]


@pytest.mark.parametrize("heads", HEADS, ids=lambda x: "H{}-HV{}-dk{}-dv{}".format(*x))
@pytest.mark.parametrize("beta_max", [1.0, 2.0], ids=["beta01", "beta02-negeig"])
@pytest.mark.parametrize("kind,n", TREE_CASES)
def test_tree_gdn_matches_recurrence_along_every_path(kind, n, beta_max, heads):
    h, hv, dk, dv = heads
    gen = torch.Generator().manual_seed(seed_of(kind, n, beta_max, heads))
    parents = random_tree(n, kind, gen)
    if kind in ("random", "mixed", "forest"):
        assert max(tree_depths(parents)) >= 4 and len(leaves(parents)) >= 4  # ancestors really interact
    q, k, v, g, beta, s0 = gdn_inputs(n, h, hv, dk, dv, gen, beta_max)
    scale = dk**-0.5
    tree = Tree(torch.zeros(n, dtype=torch.long), parents)
    out, factors = gdn.tree_gdn(q, k, v, g, beta, s0, tree.ancestor_mask, scale, keep_snapshots=True)
    ref_out, ref_states = path_oracle(q, k, v, g, beta, s0, parents, scale)
    assert out.shape == (n, hv, dv)
    assert rel_err(out, ref_out) <= 1e-12
    assert rel_err(factors.snapshots, ref_states) <= 1e-12


@pytest.mark.parametrize("heads", HEADS, ids=lambda x: "H{}-HV{}-dk{}-dv{}".format(*x))
def test_tree_gdn_on_chain_is_the_sequence_recurrence(heads):
    h, hv, dk, dv = heads
    n = 100
    gen = torch.Generator().manual_seed(7)
    q, k, v, g, beta, s0 = gdn_inputs(n, h, hv, dk, dv, gen, beta_max=2.0)
    tree = Tree.chain(torch.zeros(n, dtype=torch.long))
    out, factors = gdn.tree_gdn(q, k, v, g, beta, s0, tree.ancestor_mask, dk**-0.5)
    ref_out, ref_state = gdn.recurrent_gdn(q, k, v, g, beta, s0, dk**-0.5)
    assert rel_err(out, ref_out) <= 1e-12
    final = gdn.commit_closed_form(s0, factors, list(range(n)))
    assert rel_err(final, ref_state) <= 1e-12


@pytest.mark.parametrize("heads", HEADS, ids=lambda x: "H{}-HV{}-dk{}-dv{}".format(*x))
@pytest.mark.parametrize("with_state", [False, True])
def test_chunk_gdn_batches_the_sequence_recurrence(heads, with_state):
    """The batched chunked chain form (training, prefill) equals the recurrence row by row,
    across chunk boundaries (L = 45 in chunks of 16) and from a nonzero state."""
    h, hv, dk, dv = heads
    gen = torch.Generator().manual_seed(11)
    rows = [gdn_inputs(45, h, hv, dk, dv, gen, beta_max=2.0) for _ in range(3)]
    q, k, v, g, beta, s0 = (torch.stack(parts) for parts in zip(*rows))
    out, final = gdn.chunk_gdn(q, k, v, g, beta, s0 if with_state else None, dk**-0.5, chunk=16)
    for b in range(3):
        start = s0[b] if with_state else torch.zeros_like(s0[b])
        ref_out, ref_state = gdn.recurrent_gdn(q[b], k[b], v[b], g[b], beta[b], start, dk**-0.5)
        assert rel_err(out[b], ref_out) <= 1e-12
        assert rel_err(final[b], ref_state) <= 1e-12


def naive_kv_loop(q, k, v, g, beta, s0_vk, scale):
    """Independent token loop over a k-first state [HV, d_k, d_v] (fla's default layout)."""
    n, h, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    groups = hv // h
    s = s0_vk.transpose(1, 2).clone()  # [HV, dk, dv]
    out = torch.zeros(n, hv, dv, dtype=q.dtype)
    for t in range(n):
        for j in range(hv):
            kt, qt = k[t, j // groups], q[t, j // groups] * scale
            sj = s[j] * torch.exp(g[t, j])
            err = v[t, j] - kt @ sj  # [dv]
            sj = sj + beta[t, j] * torch.outer(kt, err)
            s[j] = sj
            out[t, j] = qt @ sj
    return out, s.transpose(1, 2)


@pytest.mark.parametrize("heads", HEADS, ids=lambda x: "H{}-HV{}-dk{}-dv{}".format(*x))
@pytest.mark.parametrize("beta_max", [1.0, 2.0])
def test_recurrent_gdn_matches_independent_kv_loop(heads, beta_max):
    h, hv, dk, dv = heads
    gen = torch.Generator().manual_seed(11)
    q, k, v, g, beta, s0 = gdn_inputs(30, h, hv, dk, dv, gen, beta_max)
    out, state = gdn.recurrent_gdn(q, k, v, g, beta, s0, dk**-0.5)
    ref_out, ref_state = naive_kv_loop(q, k, v, g, beta, s0, dk**-0.5)
    assert rel_err(out, ref_out) <= 1e-12
    assert rel_err(state, ref_state) <= 1e-12


def load_fla_naive():
    pytest.importorskip("einops", reason="fla's naive reference needs einops")
    spec = importlib.util.find_spec("fla")
    if spec is None or spec.origin is None:
        pytest.skip("flash-linear-attention (fla) is not installed: nothing to compare against")
    path = Path(spec.origin).parent / "ops" / "gated_delta_rule" / "naive.py"
    if not path.exists():
        pytest.skip(f"fla is installed but has no {path} (layout changed)")
    # loaded by path: `import fla.ops` needs triton, this file only needs torch and einops
    mod_spec = importlib.util.spec_from_file_location("fla_gdn_naive_for_tests", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module.naive_recurrent_gated_delta_rule


@pytest.mark.parametrize("heads", [(3, 3, 8, 12), (2, 4, 8, 6)], ids=["HV=H", "HV=2H-expanded"])
def test_recurrent_gdn_matches_fla_naive(heads):
    naive = load_fla_naive()
    h, hv, dk, dv = heads
    gen = torch.Generator().manual_seed(5)
    q, k, v, g, beta, s0 = gdn_inputs(40, h, hv, dk, dv, gen)
    q, k, v, g, beta, s0 = (x.float() for x in (q, k, v, g, beta, s0))
    out, state = gdn.recurrent_gdn(q, k, v, g, beta, s0, dk**-0.5)
    # fla's naive loop has no grouped value heads: give it the key heads expanded per value head
    # (fla's kernels map value head j to key head j // (HV // H))
    qe, ke = q.repeat_interleave(hv // h, dim=1), k.repeat_interleave(hv // h, dim=1)
    fo, fs = naive(
        qe[None],
        ke[None],
        v[None],
        beta[None],
        g[None],
        scale=dk**-0.5,
        initial_state=s0.transpose(1, 2)[None],
        output_final_state=True,
    )
    assert fo.dtype == torch.float32
    assert rel_err(out, fo[0]) <= 1e-5
    assert rel_err(state, fs[0].transpose(1, 2)) <= 1e-5  # fla: [B, H, K, V]; ours: [HV, V, K]


# ---------------------------------------------------------------- commit strategies


@pytest.mark.parametrize("heads", HEADS, ids=lambda x: "H{}-HV{}-dk{}-dv{}".format(*x))
@pytest.mark.parametrize("kind,n", [("random", 60), ("mixed", 50), ("fan", 20), ("forest", 40)])
def test_commit_functions_agree_with_recurrence(kind, n, heads):
    h, hv, dk, dv = heads
    gen = torch.Generator().manual_seed(seed_of(kind, n, heads))
    parents = random_tree(n, kind, gen)
    q, k, v, g, beta, s0 = gdn_inputs(n, h, hv, dk, dv, gen, beta_max=2.0)
    tree = Tree(torch.zeros(n, dtype=torch.long), parents)
    _, factors = gdn.tree_gdn(q, k, v, g, beta, s0, tree.ancestor_mask, dk**-0.5, keep_snapshots=True)
    depth = tree_depths(parents)
    deepest_leaf = max(leaves(parents), key=lambda i: depth[i])
    inner = [i for i in range(n) if depth[i] >= 2 and i not in leaves(parents)]
    interior = inner[len(inner) // 2] if inner else 0
    paths = [tree.path_to(deepest_leaf), tree.path_to(0), tree.path_to(interior), tree.path_to(n - 1), []]
    assert len(paths[0]) >= 2 and len(paths[1]) == 1
    for path in paths:
        states = {name: fn(s0, factors, path) for name, fn in gdn.COMMIT_FUNCTIONS.items()}
        if path:
            _, ref = gdn.recurrent_gdn(q[path], k[path], v[path], g[path], beta[path], s0, dk**-0.5)
        else:
            ref = s0
        for name, s in states.items():
            assert s.shape == s0.shape
            assert rel_err(s, ref) <= 1e-12, (name, path)
        assert rel_err(states["replay"], states["closed_form"]) <= 1e-12
        assert rel_err(states["snapshot"], states["closed_form"]) <= 1e-12
    # a committed state never aliases the old state or the verification's snapshots
    kept_s0, kept_snaps = s0.clone(), factors.snapshots.clone()
    for fn in gdn.COMMIT_FUNCTIONS.values():
        for path in ([], paths[0]):
            fn(s0, factors, path).add_(1.0)
    assert torch.equal(s0, kept_s0) and torch.equal(factors.snapshots, kept_snaps)


def test_snapshot_commit_needs_snapshots():
    gen = torch.Generator().manual_seed(0)
    q, k, v, g, beta, s0 = gdn_inputs(3, 2, 2, 4, 4, gen)
    _, factors = gdn.tree_gdn(q, k, v, g, beta, s0, Tree.chain([0, 0, 0]).ancestor_mask, 0.5)
    with pytest.raises(ValueError, match="keep_snapshots"):
        gdn.commit_snapshot(s0, factors, [0, 1])


# ---------------------------------------------------------------- negative controls


def tree_gdn_variant(q, k, v, g, beta, s0, ancestors, scale, positional_gate=False, causal_mask=False):
    """A small copy of tree_gdn whose gate or mask can be made wrong on purpose."""
    n, hv = v.shape[0], v.shape[1]
    qh = gdn.expand_key_heads(q, hv).transpose(0, 1) * scale
    kh = gdn.expand_key_heads(k, hv).transpose(0, 1)
    vh, bh = v.transpose(0, 1), beta.T[:, :, None]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    gate_cum = g.cumsum(0) if positional_gate else ancestors.to(g.dtype) @ g
    mask = causal if causal_mask else ancestors
    diff = gate_cum.T[:, :, None] - gate_cum.T[:, None, :]
    gamma = diff.masked_fill(~mask, float("-inf")).exp()
    strict = mask & ~torch.eye(n, dtype=torch.bool)
    eye = torch.eye(n, dtype=v.dtype)
    a = bh * (kh @ kh.transpose(1, 2) * gamma * strict)
    t = torch.linalg.solve_triangular(eye + a, eye.expand(hv, n, n), upper=False)
    delta = t @ (bh * vh) - t @ (bh * gate_cum.T.exp()[:, :, None] * kh) @ s0.transpose(1, 2)
    out = gate_cum.T.exp()[:, :, None] * (qh @ s0.transpose(1, 2)) + (qh @ kh.transpose(1, 2) * gamma) @ delta
    return out.transpose(0, 1)


@pytest.mark.parametrize("kind,n", [("random", 40), ("fan", 20), ("mixed", 40)])
def test_negative_controls_are_detected(kind, n, monkeypatch):
    h, hv, dk, dv = HEADS[0]
    gen = torch.Generator().manual_seed(123)
    parents = random_tree(n, kind, gen)
    q, k, v, g, beta, s0 = gdn_inputs(n, h, hv, dk, dv, gen)
    scale = dk**-0.5
    anc = Tree(torch.zeros(n, dtype=torch.long), parents).ancestor_mask
    ref, _ = path_oracle(q, k, v, g, beta, s0, parents, scale)

    right = tree_gdn_variant(q, k, v, g, beta, s0, anc, scale)
    assert rel_err(right, ref) <= 1e-12  # the copy itself is faithful
    wrong_gate = tree_gdn_variant(q, k, v, g, beta, s0, anc, scale, positional_gate=True)
    wrong_mask = tree_gdn_variant(q, k, v, g, beta, s0, anc, scale, causal_mask=True)
    assert rel_err(wrong_gate, ref) > 1e-3
    assert rel_err(wrong_mask, ref) > 1e-3
    # treating the tree as a chain (causal mask everywhere, hence positional gates as well)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    as_chain, _ = gdn.tree_gdn(q, k, v, g, beta, s0, causal, scale)
    assert rel_err(as_chain, ref) > 1e-3

    # the same mistake injected into the real tree_gdn (its gate helper made positional)
    def positional_gates(g_, ancestors):
        gate_cum = g_.cumsum(0)
        diff = gate_cum.T[:, :, None] - gate_cum.T[:, None, :]
        return gate_cum, diff.masked_fill(~ancestors, float("-inf")).exp()

    monkeypatch.setattr(gdn, "ancestor_gates", positional_gates)
    patched, _ = gdn.tree_gdn(q, k, v, g, beta, s0, anc, scale)
    assert rel_err(patched, ref) > 1e-3


# ---------------------------------------------------------------- short convolution


def sequential_conv(seq: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Causal depthwise conv of seq [L, C] (L >= W) with F.conv1d; returns the last output [C]."""
    c, w = weight.shape
    # no padding: seq already starts with the history (.contiguous(): float64 conv1d is slow otherwise)
    y = F.conv1d(seq.T[None].contiguous(), weight[:, None, :].contiguous(), bias, groups=c)
    assert y.shape == (1, c, seq.shape[0] - w + 1)
    return y[0, :, -1]


@pytest.mark.parametrize("width", [4, 2])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("kind,n", [("random", 30), ("fan", 12), ("chain", 9), ("forest", 25)])
def test_tree_short_conv_matches_sequential_conv(kind, n, width, with_bias):
    c = 7
    gen = torch.Generator().manual_seed(seed_of(kind, n, width, with_bias))
    parents = random_tree(n, kind, gen)
    tree = Tree(torch.zeros(n, dtype=torch.long), parents)
    x = torch.randn(n, c, generator=gen, dtype=F64)
    history = torch.randn(width - 1, c, generator=gen, dtype=F64)
    weight = torch.randn(c, width, generator=gen, dtype=F64)
    bias = torch.randn(c, generator=gen, dtype=F64) if with_bias else None
    y = gdn.tree_short_conv(x, history, weight, parents, bias)
    y_lin = gdn.tree_short_conv(x, history, weight, parents, bias, activation=False)
    short = 0
    for i in range(n):
        path = tree.path_to(i)
        short += len(path) < width  # this node's window reaches into the history
        pre = sequential_conv(torch.cat([history, x[path]]), weight, bias)
        assert rel_err(y_lin[i], pre) <= 1e-12
        assert rel_err(y[i], F.silu(pre)) <= 1e-12
    assert short >= 1


@pytest.mark.parametrize("width", [4, 2])
def test_conv_history_after_commit(width):
    c, n = 5, 20
    gen = torch.Generator().manual_seed(width)
    parents = random_tree(n, "mixed", gen)
    tree = Tree(torch.zeros(n, dtype=torch.long), parents)
    x = torch.randn(n, c, generator=gen, dtype=F64)
    history = torch.randn(width - 1, c, generator=gen, dtype=F64)
    weight = torch.randn(c, width, generator=gen, dtype=F64)
    depth = tree_depths(parents)
    one = next(i for i in range(n) if depth[i] == 1)
    deep = max(range(n), key=lambda i: depth[i])
    for path in ([], tree.path_to(one), tree.path_to(deep), tree.path_to(n - 1)):
        new_hist = gdn.conv_history_after(history, x, path)
        rows = [history[r] for r in range(width - 1)] + [x[j] for j in path]
        expected = torch.stack(rows[len(rows) - (width - 1) :])
        assert new_hist.shape == (width - 1, c)
        assert torch.equal(new_hist, expected)
        # the new history continues the path: a next token sees exactly the sequential window
        x_next = torch.randn(1, c, generator=gen, dtype=F64)
        y = gdn.tree_short_conv(x_next, new_hist, weight, torch.tensor([-1]), activation=False)
        seq = torch.cat([history, x[path], x_next]) if path else torch.cat([history, x_next])
        assert rel_err(y[0], sequential_conv(seq, weight, None)) <= 1e-12


# ---------------------------------------------------------------- tree validation


@pytest.mark.parametrize(
    "tokens,parents,needle",
    [
        ([1, 2, 3], [-1, 2, 1], "parent after its child"),
        ([1, 2, 3], [-1, 0, 2], "its own parent"),
        ([1, 2, 3], [-1, -2, 0], "parent -2: an invalid parent index"),
        ([1, 2, 3], [-1, 0], "3 tokens but 2 parent"),
        ([], [], "empty"),
    ],
    ids=["parent-after-child", "self-parent", "parent-below-minus-one", "length-mismatch", "empty"],
)
def test_tree_validation_errors(tokens, parents, needle):
    with pytest.raises(TreeError) as info:
        Tree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))
    msg = str(info.value)
    assert "\n" not in msg
    assert needle in msg


def test_tree_too_large():
    n = MAX_TREE_NODES + 1
    with pytest.raises(TreeError) as info:
        Tree.chain(torch.zeros(n, dtype=torch.long))
    msg = str(info.value)
    assert "\n" not in msg and "too large" in msg and str(n) in msg
    Tree.chain(torch.zeros(MAX_TREE_NODES, dtype=torch.long))  # the limit itself is allowed


def test_tree_structure_helpers():
    tree = Tree(torch.tensor([5, 6, 7, 8, 9]), torch.tensor([-1, 0, -1, 1, 0]))
    assert tree.depth.tolist() == [1, 2, 1, 3, 2]
    assert tree.path_to(3) == [0, 1, 3]
    assert tree.children_of(-1) == [0, 2] and tree.children_of(0) == [1, 4]
    expected = torch.tensor(
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 0, 0, 1]],
        dtype=torch.bool,
    )
    assert torch.equal(tree.ancestor_mask, expected)
    assert Tree.chain([1, 2, 3]).is_chain and not tree.is_chain


# ---------------------------------------------------------------- capturable commits (backends)


@pytest.mark.parametrize("width", [4, 1])
def test_reference_commit_function_is_the_closed_form_and_conv_commit(width):
    """backends.commit_function("reference"): state and conv history in place, node as a device tensor."""
    from repro.gdn.backends import commit_function

    n, (h, hv, dk, dv), c = 30, HEADS[0], 7
    gen = torch.Generator().manual_seed(width)
    parents = random_tree(n, "mixed", gen)
    tree = Tree(torch.zeros(n, dtype=torch.long), parents)
    q, k, v, g, beta, s0 = gdn_inputs(n, h, hv, dk, dv, gen)
    _, f = gdn.tree_gdn(q, k, v, g, beta, s0, tree.ancestor_mask, dk**-0.5)
    x = torch.randn(n, c, generator=gen, dtype=F64)
    history = torch.randn(width - 1, c, generator=gen, dtype=F64)
    index = gdn.conv_gather_index(parents, width)
    commit = commit_function("reference", torch.device("cpu"))
    for end in [-1, 0, n - 1, max(range(n), key=lambda i: len(tree.path_to(i)))]:
        path = tree.path_to(end) if end >= 0 else []
        state, hist = s0.clone(), history.clone()
        commit(
            state, f.delta, f.k, f.gate_cum, tree.ancestor_mask, torch.tensor([end]), conv=(hist, x, index)
        )
        ref = (
            gdn.recurrent_gdn(q[path], k[path], v[path], g[path], beta[path], s0, dk**-0.5)[1] if path else s0
        )
        assert rel_err(state, ref) <= 1e-12, end
        assert torch.equal(hist, gdn.conv_history_after(history, x, path)), end


def test_delayed_commit_step_is_commit_then_verify():
    """tree_function("reference") with a pending commit == replaying the previous path, then verifying
    the new tree from that state along every path (and the committed state is left in ``state``)."""
    from repro.gdn.backends import tree_function

    (h, hv, dk, dv), scale = HEADS[1], HEADS[1][2] ** -0.5
    gen = torch.Generator().manual_seed(11)
    prev_parents, parents = random_tree(25, "random", gen), random_tree(18, "mixed", gen)
    prev = Tree(torch.zeros(25, dtype=torch.long), prev_parents)
    pq, pk, pv, pg, pb, s0 = gdn_inputs(25, h, hv, dk, dv, gen)
    _, pf = gdn.tree_gdn(pq, pk, pv, pg, pb, s0, prev.ancestor_mask, scale)
    end = max(range(25), key=lambda i: len(prev.path_to(i)))
    path = prev.path_to(end)
    _, committed = gdn.recurrent_gdn(pq[path], pk[path], pv[path], pg[path], pb[path], s0, scale)
    q, k, v, g, beta, _ = gdn_inputs(18, h, hv, dk, dv, gen)
    tree = Tree(torch.zeros(18, dtype=torch.long), parents)
    pending = gdn.PendingCommit(pf.delta, pf.k, pf.gate_cum, prev.ancestor_mask, torch.tensor([end]))
    state = s0.clone()
    verify = tree_function("reference", torch.device("cpu"))
    o, _ = verify(q, k, v, g, beta, state, parents, tree.ancestor_mask, scale, False, pending=pending)
    assert rel_err(state, committed) <= 1e-12
    ref_o, _ = path_oracle(q, k, v, g, beta, committed, parents, scale)
    assert rel_err(o, ref_o) <= 1e-12


def test_tree_function_kernel_choice():
    from repro.errors import ConfigError
    from repro.gdn import backends

    cpu = torch.device("cpu")
    assert backends.tree_function("reference", cpu, kernel="split") is backends._reference
    with pytest.raises(ConfigError, match="unknown tree kernel"):
        backends.tree_function("reference", cpu, kernel="chunked")
