"""StaticDecoder's ``fuse_verify``: verify's matmuls on the row-tiled kernels of repro.gdn.triton_linear.

- Interpreter (CPU, one TRITON_INTERPRET=1 subprocess, this file as a script): a [GDN, ATTENTION, GDN]
  model of width 40 (no tile multiple) with z gate, output gate and GQA; verify logits of random trees of
  5 and 17 nodes with ``fuse_verify`` on vs off (cuBLAS-path glue), float64 (to rounding, and vs
  HybridLM.verify) and float32 (~1e-6; 17 nodes), and the closed-form commit after each, in every variant
  (:data:`VARIANTS`, the GDN output's gated norm inside the out_proj's launch among them); the fused verify
  capture-safe with the same trace on two trees; the launches of a verify of the tiny-qwen35 layout off
  vs on; slots over MAX_VERIFY_ROWS keep cuBLAS.
- CPU: the default rule (off without ``gemv``; on with it: interpreter) and the ConfigError without the
  fused decoder.
- GPU (``gpu``): the verify CUDA graph with ``fuse_verify`` equals the unfused graph (float32 within
  1e-5, bf16 within 3e-2) and captures.
"""

from __future__ import annotations

import itertools
import json
import sys
from functools import partial

import pytest
import torch
from conftest import CountedLaunches, random_tree, run_in_interpreter

from repro.errors import ConfigError

F64 = torch.float64
SIZES = (5, 17)  # one and two row blocks of the row-tiled kernels (33, 64 rows: test_triton_linear.py)
TOL = {"float64": 1e-12, "float32": 1e-5, "bfloat16": 3e-2}


def small_model(dtype: torch.dtype, device: str = "cpu", seed: int = 11):  # noqa: ANN201
    from repro.models.config import ATTENTION, GDN, HybridConfig
    from repro.models.default import init_random_weights
    from repro.models.hybrid import HybridLM

    cfg = HybridConfig(
        vocab_size=61, hidden_size=40, intermediate_size=56, layer_types=[GDN, ATTENTION, GDN],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, partial_rotary_factor=0.5,
    )  # fmt: skip
    return init_random_weights(HybridLM(cfg), seed).to(device=device, dtype=dtype).eval()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    if not bool(torch.isfinite(a).all()):
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def tree_of(n: int, seed: int, vocab: int = 61):  # noqa: ANN201
    from repro.tree import Tree

    gen = torch.Generator().manual_seed(seed)
    parents = random_tree(n, "mixed", gen)
    parents[0] = -1
    return Tree(torch.randint(0, vocab, (n,), generator=gen), parents)


def state_errs(a, b) -> float:  # noqa: ANN001 - ModelStates
    errs = [float(abs(a.position - b.position))]
    for x, y in zip(a.layers, b.layers):
        errs += [rel(u, v) for u, v in zip(vars(x).values(), vars(y).values())]
    return max(errs)


def verify_run(model, state, tree, fuse: bool, graphed: bool = False, fold: bool | None = None) -> dict:  # noqa: ANN001
    """Verify ``tree`` from ``state`` (a CUDA graph of it with ``graphed``), then its closed-form commit
    along the deepest path. A float64 model's GDN cores run on the reference tree evaluator (the Triton
    tree kernels take float32 at most; the glue and the linears around them are what is compared).
    ``fold``: the decoder's ``fold_norms``."""
    from repro.gdn.backends import tree_function
    from repro.models.static import StaticDecoder, TreeSlot

    dec = StaticDecoder(model, 64, 64, kernel="triton", fuse_verify=fuse, fold_norms=fold)
    if model.dtype == F64:
        dec._tree = tree_function("reference", model.device)
    dec.load(state)
    slot = TreeSlot(dec, tree.size, max_depth=int(tree.depth.max()))
    slot.set_tree(tree)
    call = partial(dec.verify, slot)
    if graphed:
        from repro.models.graphs import GraphedCall

        call = GraphedCall(call, model.device)
        dec.load(state)
    logits = call().clone()
    slot.set_accepted(tree.path_to(int(tree.depth.argmax())))
    dec.commit(slot, "closed_form")
    return {"logits": logits, "state": dec.export()}


# the fused verify's variants: (verify form, fold_norms, static_layers.GATED_OUT_PROJ): the row-tiled kernel
# on the folded normed matrices (the default), on the scaled rows, with the GDN output's gated norm inside the
# out_proj's launch, and the GEMV kernel over groups of 4 rows
VARIANTS = {
    "dot": ("dot", None, False),
    "dot-scaled": ("dot", False, False),
    "dot-gated": ("dot", None, True),
    "gemv": ("gemv", None, False),
}


def verify_cases(device: str, sizes: tuple[int, ...] = SIZES) -> dict[str, dict[str, float]]:
    """fuse_verify on vs off per dtype, tree size and variant (:data:`VARIANTS`): logits and the committed
    state (float64: also vs HybridLM's verify and commit). On the CPU float32 at the largest size only
    (two row blocks)."""
    from repro.gdn.triton_linear import verify_form
    from repro.models import static_layers

    out = {}
    for dname in ("float64", "float32") if device == "cpu" else ("float32", "bfloat16"):
        model = small_model(getattr(torch, dname), device)
        state, _ = model.prefill([3, 9, 1, 4, 1, 5, 9, 2])
        unfused: dict[tuple[int, bool], dict] = {}  # the same for every variant: run once
        hybrid: dict[int, tuple] = {}  # float64: HybridLM's verify logits and committed state, once a tree
        for t, variant in itertools.product(sizes if dname != "float32" or device == "cuda" else sizes[-1:],
                                            VARIANTS):  # fmt: skip
            form, fold, gated = VARIANTS[variant]
            tree = tree_of(t, t)
            for graphed in (False, True) if device == "cuda" else (False,):
                if (t, graphed) not in unfused:
                    unfused[t, graphed] = verify_run(model, state, tree, False, graphed)
                old = unfused[t, graphed]
                default, static_layers.GATED_OUT_PROJ = static_layers.GATED_OUT_PROJ, gated
                try:
                    with verify_form(form):
                        new = verify_run(model, state, tree, True, graphed, fold)
                finally:
                    static_layers.GATED_OUT_PROJ = default
                errs = {
                    "logits": rel(new["logits"], old["logits"]),
                    "state": state_errs(new["state"], old["state"]),
                }
                if dname == "float64":
                    if t not in hybrid:
                        ver, deepest = model.verify(state, tree), tree.path_to(int(tree.depth.argmax()))
                        hybrid[t] = ver.logits, model.commit(state, ver, deepest)
                    errs["logits_vs_hybrid"] = rel(new["logits"], hybrid[t][0])
                    errs["state_vs_hybrid"] = state_errs(new["state"], hybrid[t][1])
                out[f"{dname}/T{t}/{variant}{'/graphed' if graphed else ''}"] = errs
    return out


def check(res: dict[str, dict[str, float]]) -> list[str]:
    return [
        f"{key} {field}: {val}"
        for key, errs in res.items()
        for field, val in errs.items()
        if not val <= TOL[key.split("/")[0]]
    ]


def capture_facts() -> dict[str, object]:
    """The fused verify under CaptureCheck (a deriving slot: its inputs derived inside the step): hazards
    and the same trace for two trees; slots over MAX_VERIFY_ROWS keep cuBLAS; the default (with gemv)."""
    from repro.gdn.triton_linear import MAX_VERIFY_ROWS
    from repro.models.graphs import check_capture
    from repro.models.static import StaticDecoder, TreeSlot

    model = small_model(torch.float32)
    state, _ = model.prefill([1, 2, 3, 4])
    dec = StaticDecoder(model, 32, MAX_VERIFY_ROWS + 1, kernel="triton", fuse_verify=True)
    slot = TreeSlot(dec, 6, derive=True)
    traces, hazards = [], []
    for seed in (1, 2):
        dec.load(state)
        slot.set_tree(tree_of(6, seed))
        check = check_capture(partial(dec.verify, slot))
        traces.append(check.trace)
        hazards += check.hazards
    big = TreeSlot(dec, MAX_VERIFY_ROWS + 1)
    return {
        "default_with_gemv": StaticDecoder(model, 8, kernel="triton", gemv=True).fuse_verify,
        "default_without": StaticDecoder(model, 8, kernel="triton").fuse_verify,
        "hazards": hazards,
        "same_trace": traces[0] == traces[1],
        "rows": dec._verify_rows(slot),
        "big_rows": dec._verify_rows(big),
    }


def fold_facts() -> dict[str, list[bool]]:
    """Whether a fused-verify decoder made the folded copies (fold_norms, the LM head's, any layer's) at
    slots of MAX_ROWS nodes, one more, and one node with fold_norms=True."""
    from repro.gdn.triton_linear import MAX_ROWS
    from repro.models.static import StaticDecoder

    model = small_model(F64)
    out = {}
    for name, nodes, fold in (("at_max_rows", MAX_ROWS, None), ("one_more", MAX_ROWS + 1, None),
                              ("forced_one_node", 1, True)):  # fmt: skip
        dec = StaticDecoder(model, 8, nodes, kernel="triton", fuse_verify=True, fold_norms=fold)
        out[name] = [dec.fold_norms, dec.folded_head is not None, any(w.folded for w in dec.weights)]
    return out


def launch_counts() -> dict[str, dict[str, int]]:
    """Launches of one verify of the tiny-qwen35 layout (6 GDN + 2 attention layers; random float32
    weights, smaller widths; 3 nodes: the count does not depend on T), fuse_verify off vs on: aten ops
    that launch work and Triton launches."""
    from repro.gdn import triton_attention, triton_decode, triton_linear, triton_tree
    from repro.models.default import init_random_weights
    from repro.models.family import resolve_checkpoint
    from repro.models.graphs import count_ops
    from repro.models.hybrid import HybridLM
    from repro.models.loading import read_config
    from repro.models.static import StaticDecoder, TreeSlot

    counter = [0]
    for module in (triton_attention, triton_decode, triton_linear, triton_tree):
        for name in dir(module):
            if name.endswith("_kernel"):
                setattr(module, name, CountedLaunches(getattr(module, name), counter))
    cfg = read_config(resolve_checkpoint("tiny-qwen35", "target"))
    cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size = 64, 32, 48  # launches: widths do not count
    cfg.linear_key_head_dim = cfg.linear_value_head_dim = cfg.head_dim = 16
    model = init_random_weights(HybridLM(cfg), 0).float().eval()
    state, _ = model.prefill([5, 6, 7])
    out = {}
    for fuse in (False, True):
        dec = StaticDecoder(model, 16, 64, kernel="triton", fuse_verify=fuse)
        dec.load(state)
        slot = TreeSlot(dec, 3)
        slot.set_tree(tree_of(3, 3, 64))
        counter[0] = 0
        ops = count_ops(partial(dec.verify, slot))
        out["fused" if fuse else "old"] = {"aten": ops, "triton": counter[0], "total": ops + counter[0]}
    return out


# ------------------------------------------------------------------------------------ interpreter


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_in_interpreter(__file__)


def test_fused_verify_matches_the_unfused_one_in_the_interpreter(interpreted):
    res = interpreted["verify"]
    assert len(res) == len(VARIANTS) * (len(SIZES) + 1) and check(res) == []
    assert max(e["logits"] for k, e in res.items() if k.startswith("float32")) > 0  # really another path
    f32 = {k.split("/")[2]: e["logits"] for k, e in res.items() if k.startswith("float32")}
    assert f32["dot"] != f32["dot-scaled"]  # the folded weights: another rounding, so another path
    assert f32["dot"] != f32["dot-gated"]  # the gated norm in the out_proj's launch: another summation


def test_fused_verify_is_capture_safe_and_bounded(interpreted):
    assert interpreted["capture"] == {
        "default_with_gemv": True,
        "default_without": False,
        "hazards": [],
        "same_trace": True,
        "rows": True,
        "big_rows": False,
    }


def test_fused_verify_launches_fewer_kernels(interpreted):
    """tiny-qwen35 layout, a verify (149 launches unfused): per layer the four matmuls (aten) become four
    Triton launches, the two RMSNorm and the SiLU * up launches go, and the final norm rides on the LM
    head: 33 aten ops fewer, 8 Triton launches more, 25 fewer in all (124)."""
    old, new = interpreted["launches"]["old"], interpreted["launches"]["fused"]
    assert (old["aten"] - new["aten"], new["triton"] - old["triton"]) == (33, 8), (old, new)
    assert old["total"] - new["total"] == 25, (old, new)


def test_check_flags_errors_over_their_bounds():
    assert check({"float32/T5": {"logits": 1e-3, "state": float("nan")}, "float64/T5": {"logits": 0.0}}) == [
        "float32/T5 logits: 0.001",
        "float32/T5 state: nan",
    ]


def test_fuse_verify_default_and_config_errors():
    from repro.models.static import StaticDecoder

    model = small_model(F64)
    with pytest.raises(ConfigError, match="fuse_verify=True runs inside the fused decoder"):
        StaticDecoder(model, 8, fuse_verify=True)
    assert not StaticDecoder(model, 8).fuse_verify
    assert not StaticDecoder(model, 8, fuse_verify=False).fuse_verify
    with pytest.raises(ConfigError, match="fold_norms=True is for the fused decoder"):
        StaticDecoder(model, 8, fold_norms=True)
    assert StaticDecoder(model, 8).folded_head is None


def test_folded_copies_only_where_a_slot_takes_the_row_tiled_kernel(interpreted):
    """Slots of at most MAX_ROWS nodes verify on the GEMV kernel, which reads the weights as they are: a
    decoder of such slots makes no folded copies (at the Qwen3.6-27B shape they were ~24 GB a one-node
    decoder never read, and did not fit an 80 GB card beside the weights); one node more folds them;
    fold_norms=True folds whatever the slots."""
    assert interpreted["folds"] == {
        "at_max_rows": [False, False, False],  # fold_norms, the head's copy, any layer's copies
        "one_more": [True, True, True],
        "forced_one_node": [True, True, True],
    }


def test_fold_weights_fold_each_normed_matrix_once():
    """fold_weights: in_proj (GDN) or q|k|v (attention) times the input norm's scale, gate|up times the
    post norm's, column by column; the unfolded matrices stay as they were."""
    from repro.models.config import GDN
    from repro.models.static_layers import AttentionWeights, GDNWeights, fold_weights

    model = small_model(F64)
    for layer in model.model.layers:
        w = GDNWeights.of(layer, F64, True) if layer.layer_type == GDN else AttentionWeights.of(layer, True)
        first = w.in_proj if isinstance(w, GDNWeights) else w.qkv
        before = first.clone()
        fold_weights(w)
        name = "in_proj" if isinstance(w, GDNWeights) else "qkv"
        assert set(w.folded) == {name, "gate_up"}
        torch.testing.assert_close(w.folded[name], first * w.input_norm[None, :], rtol=1e-15, atol=0)
        torch.testing.assert_close(w.folded["gate_up"], w.gate_up * w.post_norm[None, :], rtol=1e-15, atol=0)
        assert torch.equal(first, before) and not torch.equal(w.folded[name], first)


# ---------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_fused_verify_graph_matches_the_unfused_one():
    """fuse_verify True vs False on CUDA, eager and as CUDA graphs, 5 and 33 nodes (row blocks of 16 and
    64: two compiles per matrix and dtype), both verify forms: float32 within 1e-5 (logits and the
    committed state), bf16 within 3e-2; the default follows gemv."""
    from repro.models.static import StaticDecoder

    sizes = (5, 33)
    res = verify_cases("cuda", sizes)
    print(json.dumps(res, indent=1))
    assert len(res) == 2 * len(VARIANTS) * 2 * len(sizes) and check(res) == []
    model = small_model(torch.bfloat16, "cuda")
    assert StaticDecoder(model, 8, gemv=True).fuse_verify and not StaticDecoder(model, 8).fuse_verify


def _interpreter_main() -> None:
    import repro.gdn.triton_common  # noqa: F401 - the interpreter's NumPy patch

    torch.set_num_threads(1)
    out = {
        "verify": verify_cases("cpu"), "capture": capture_facts(), "launches": launch_counts(),
        "folds": fold_facts(),
    }  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
