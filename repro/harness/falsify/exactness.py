"""Reviewers' falsification checks. ``tree_exactness``: SpecLA's check 2.

A draft tree whose nodes' ancestors interact is verified in one pass (reference on CPU, or each
Triton tree kernel on GPU: fused, split and blocked, :data:`repro.gdn.backends.TREE_KERNELS`) and
compared with the token-by-token float64 recurrence run along every root-to-node path (each node one
step from its parent's state, so every path is the exact sequential recurrence). Logits and committed
states must agree to rounding; two negative controls (a positional cumulative gate; a causal mask
instead of the tree mask) must not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
import torch

from repro.bench.shapes import random_parents
from repro.errors import ReproError
from repro.gdn.backends import TREE_KERNELS, check_backend, tree_function
from repro.gdn.reference import commit_closed_form, expand_key_heads
from repro.models.default import build_default_target
from repro.models.hybrid import HybridLM
from repro.reporting.report import markdown_table
from repro.reporting.rundir import Run, RunDir, RunKind, fields_parser
from repro.tree import Tree

CONTROL_MIN = 1e-3  # a negative control must differ from the truth by more than this
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}
CASES = (("random", 40), ("mixed", 64), ("fan", 32), ("forest", 48), ("chain", 64))
GPU_SHAPES = {"weaver": (16, 48, 128, 128), "specla": (8, 8, 256, 256)}


@dataclass
class ExactnessRow:
    level: str  # "layer" or "model"
    shape: str
    tree: str
    nodes: int
    depth: int
    backend: str
    kernel: str  # the Triton tree kernel (fused, split, blocked); the reference: "reference"
    dtype: str
    err_outputs: float  # max |candidate - truth| / max |truth| over every node
    err_state: float  # committed state along the deepest path, same measure
    control_positional_gate: float | None
    control_causal_mask: float | None
    tol: float
    verdict: str


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    b = b.double()
    return float((a.double() - b).abs().max() / b.abs().max().clamp(min=1e-300))


def sequential_states(q, k, v, g, beta, s0, parents, scale):
    """float64 truth: per node, the output and the state after the path's last token."""
    hv = v.shape[1]
    q = expand_key_heads(q, hv) * scale
    k = expand_key_heads(k, hv)
    states, outs = [], []
    for i, p in enumerate(parents.tolist()):
        s = (s0 if p < 0 else states[p]) * g[i].exp()[:, None, None]
        s = s + torch.einsum(
            "hv,hk->hvk", beta[i][:, None] * (v[i] - torch.einsum("hvk,hk->hv", s, k[i])), k[i]
        )
        states.append(s)
        outs.append(torch.einsum("hvk,hk->hv", s, q[i]))
    return torch.stack(outs), states


def positional_gate(g: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """Per-node gates whose ancestor sums equal a positional cumsum: the wrong gate of a
    verifier that charges a node for its siblings' decays."""
    pos = g.cumsum(0)
    parent_pos = torch.where(parents[:, None] >= 0, pos[parents.clamp(min=0)], torch.zeros_like(pos))
    return pos - parent_pos


def layer_case(
    kind: str,
    n: int,
    shape: tuple[int, int, int, int],
    backend: str,
    device: str,
    seed: int,
    kernel: str = "fused",
):
    h, hv, dk, dv = shape
    gen = torch.Generator().manual_seed(seed)
    parents = random_parents(n, kind, gen)
    tree = Tree(torch.zeros(n, dtype=torch.long), parents)
    f64 = dict(dtype=torch.float64)
    q = torch.nn.functional.normalize(torch.randn(n, h, dk, generator=gen, **f64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(n, h, dk, generator=gen, **f64), dim=-1)
    v = torch.randn(n, hv, dv, generator=gen, **f64)
    g = -torch.rand(n, hv, generator=gen, **f64) * 0.5
    beta = torch.rand(n, hv, generator=gen, **f64)
    s0 = torch.randn(hv, dv, dk, generator=gen, **f64) * 0.3
    scale = dk**-0.5
    truth_o, truth_states = sequential_states(q, k, v, g, beta, s0, parents, scale)
    dtype = torch.float64 if backend == "reference" else torch.float32
    dev = torch.device(device)
    run = tree_function(backend, dev, kernel=kernel) if backend == "triton" else tree_function(backend, dev)

    def verify(gates: torch.Tensor, mask: torch.Tensor):
        args = [x.to(dev, dtype) for x in (q, k, v, gates, beta)]
        return run(*args, s0.to(dev, torch.float32 if dtype == torch.float32 else dtype),
                   parents.to(dev), mask.to(dev), scale, False)  # fmt: skip

    o, factors = verify(g, tree.ancestor_mask)
    deepest = tree.path_to(int(tree.depth.argmax()))
    state = commit_closed_form(s0.to(dev, factors.delta.dtype), factors, deepest)
    controls: list[float | None] = [None, None]
    if not tree.is_chain:
        controls[0] = rel_err(verify(positional_gate(g, parents), tree.ancestor_mask)[0].cpu(), truth_o)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        controls[1] = rel_err(verify(g, causal)[0].cpu(), truth_o)
    return tree, o.cpu(), state.cpu(), truth_o, truth_states[deepest[-1]], controls, dtype


def model_case(kind: str, n: int, seed: int) -> tuple[Tree, float, float]:
    """The whole embedded default target (hybrid, float64): one tree verify vs sequential decode."""
    model: HybridLM = build_default_target(seed=0, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (24,), generator=gen)
    state, _ = model.prefill(prompt)
    tree = Tree(torch.randint(0, vocab, (n,), generator=gen), random_parents(n, kind, gen))
    ver = model.verify(state, tree)
    node_states, node_logits = [], []
    for i, p in enumerate(tree.parents.tolist()):
        base = state if p < 0 else node_states[p]
        single = model.verify(base, Tree.single(int(tree.tokens[i])))
        node_logits.append(single.logits[0])
        node_states.append(model.commit(base, single, [0]))
    err_logits = rel_err(ver.logits, torch.stack(node_logits))
    deepest = tree.path_to(int(tree.depth.argmax()))
    committed = model.commit(state, ver, deepest)
    truth = node_states[deepest[-1]]
    err_state = max(
        rel_err(a.recurrent, b.recurrent) if hasattr(a, "recurrent") else rel_err(a.keys, b.keys)
        for a, b in zip(committed.layers, truth.layers)
    )
    return tree, err_logits, err_state


def verdict(err: float, err_state: float, tol: float, controls: list[float | None]) -> str:
    if not (err <= tol and err_state <= tol):
        return "FAIL: verifier differs from the sequential recurrence"
    if any(c is not None and not c > CONTROL_MIN for c in controls):
        return "FAIL: a negative control was not detected"
    return "pass"


def tree_exactness(device: str = "cpu", backend: str = "reference", seed: int = 0) -> list[ExactnessRow]:
    """All rows of the tree-exactness check on ``device`` with ``backend`` (``triton``: every tree kernel,
    each on the same trees)."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ReproError("--device cuda asked for, but no CUDA GPU is available here")
    shapes = {"small": (2, 4, 32, 16)} if device == "cpu" else GPU_SHAPES
    kernels = TREE_KERNELS if backend == "triton" else ("reference",)
    rows: list[ExactnessRow] = []
    for kernel in kernels:
        for shape_name, shape in shapes.items():
            larger = (("random", 128), ("mixed", 256)) if device != "cpu" else ()
            for i, (kind, n) in enumerate(CASES + larger):
                tree, o, state, truth_o, truth_state, controls, dtype = layer_case(
                    kind, n, shape, backend, device, seed + i, kernel
                )
                tol = TOLERANCE[dtype]
                err, err_s = rel_err(o, truth_o), rel_err(state, truth_state)
                dtype_name = str(dtype).removeprefix("torch.")
                row = ExactnessRow(
                    "layer", shape_name, kind, n, int(tree.depth.max()), backend, kernel, dtype_name, err,
                    err_s, controls[0], controls[1], tol, verdict(err, err_s, tol, controls),
                )  # fmt: skip
                rows.append(row)
    for i, (kind, n) in enumerate(CASES[:3]):
        tree, err, err_s = model_case(kind, n, seed + 100 + i)
        tol = TOLERANCE[torch.float64]
        rows.append(ExactnessRow(
            "model", "embedded-default", kind, n, int(tree.depth.max()), "reference", "reference", "float64",
            err, err_s,
            None, None, tol, verdict(err, err_s, tol, [None, None]),
        ))  # fmt: skip
    return rows


def open_exactness_run(out: Path, config: dict) -> RunDir:
    """The run directory of a tree-exactness check; opened before the check runs, so that a backend the
    device cannot run, an existing run or a foreign non-empty directory is refused at once (nothing
    written)."""
    from repro.reporting.records import build_manifest

    check_backend(config.get("backend", "reference"), torch.device(config.get("device", "cpu")))

    return RunDir(out, build_manifest(config), kind=KIND)


def write_exactness(rows: list[ExactnessRow], run: RunDir) -> str:
    """Append the rows to ``run`` and write its report; returns the markdown."""
    for row in rows:
        run.append(asdict(row))
    return run.write_report()


def build_report(run: Run, figures_dir: Path | None) -> str:
    """report.md of a tree-exactness run, from its records."""
    table = markdown_table(pd.DataFrame(run.records), {
        "err_outputs": "{:.1e}", "err_state": "{:.1e}", "control_positional_gate": "{:.2g}",
        "control_causal_mask": "{:.2g}", "tol": "{:.0e}",
    })  # fmt: skip
    text = (
        "# Tree exactness (SpecLA falsification check 2)\n\n"
        "Every node of a tree whose ancestors interact, verified in one pass, against the float64\n"
        "token-by-token recurrence along its root-to-node path; errors are max |diff| / max |truth|.\n"
        f"Negative controls must differ by more than {CONTROL_MIN:g}.\n\n{table}\n"
    )
    run.write("report.md", text)
    return text


KIND = RunKind(
    "falsify-tree-exactness",
    fields_parser("level", "shape", "tree", "nodes", "backend", "err_outputs", "err_state", "verdict"),
    build_report,
    ("report.md",),
)
