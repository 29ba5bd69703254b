"""The chain verifier (repro.gdn.chain) against the float64 token-by-token recurrence.

- CPU: the reference method in float64 (to rounding) and from bf16 inputs; the state is never written;
  the choice table covers every length with a known method; the device choice's fallbacks;
- interpreter (TRITON_INTERPRET=1, one subprocess): the project's tree kernels in chain mode;
- gpu: every method (fla's chunk and recurrent kernels, both tree kernels, the default choice) at both
  paper shapes and lengths 16..256 from bf16 inputs, and the default choice inside a CUDA graph.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
import torch.nn.functional as F
from conftest import run_in_interpreter

from repro.gdn import chain
from repro.gdn import reference as gdn


def chain_inputs(h: int, hv: int, dk: int, dv: int, n: int, seed: int, dtype: torch.dtype = torch.float64):
    """(q, k, v, g, beta, state): q/k/v bf16-representable, in ``dtype``; g, beta, state float64."""
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64

    def bf16(x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.bfloat16).to(dtype)

    q = bf16(F.normalize(torch.randn(n, h, dk, generator=gen, dtype=f64), dim=-1))
    k = bf16(F.normalize(torch.randn(n, h, dk, generator=gen, dtype=f64), dim=-1))
    v = bf16(torch.randn(n, hv, dv, generator=gen, dtype=f64))
    g = -torch.rand(n, hv, generator=gen, dtype=f64) * 0.5
    beta = torch.rand(n, hv, generator=gen, dtype=f64).clamp(0.02, 0.98)
    state = torch.randn(hv, dv, dk, generator=gen, dtype=f64).float().double()
    return q, k, v, g, beta, state


def oracle(q, k, v, g, beta, state, scale) -> torch.Tensor:  # noqa: ANN001
    """The float64 token-by-token recurrence's outputs."""
    return gdn.recurrent_gdn(*(t.double() for t in (q, k, v, g, beta, state)), scale)[0]


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double().cpu() - ref.cpu()).norm() / ref.norm())


def method_error(
    method: str | None, shape: tuple[int, int, int, int], n: int, seed: int, device: str, dtype: torch.dtype
) -> float:
    """verify_chain(method) vs the oracle; asserts the state is left bit for bit."""
    h, hv, dk, dv = shape
    x = chain_inputs(h, hv, dk, dv, n, seed)
    scale = dk**-0.5
    q, k, v = (t.to(device, dtype) for t in x[:3])
    g, beta, state = (t.to(device, torch.float32) for t in x[3:])
    before = state.clone()
    o = chain.verify_chain(q, k, v, g, beta, state, scale, method=method)
    assert torch.equal(state, before), f"{method} wrote the state"
    assert o.shape == (n, hv, dv) and o.dtype == dtype
    return rel(o, oracle(*x, scale))


def test_reference_method_is_the_recurrence_in_float64() -> None:
    q, k, v, g, beta, state = chain_inputs(2, 4, 8, 6, 70, 0)  # two key heads shared by four value heads
    before = state.clone()
    o = chain.verify_chain(q, k, v, g, beta, state, 8**-0.5, method="reference")
    assert torch.equal(state, before)
    assert rel(o, oracle(q, k, v, g, beta, state, 8**-0.5)) < 1e-12  # 70 tokens: two chunks


def test_reference_method_from_bf16_inputs() -> None:
    err = method_error("reference", (2, 4, 16, 16), 20, 1, "cpu", torch.bfloat16)
    assert err < 1e-2  # bf16 outputs


def test_choice_table_covers_every_length() -> None:
    for cls, rows in chain.CHAIN_CHOICE.items():
        assert rows[-1][0] is None, cls  # the last row takes any length
        bounds = [b for b, _ in rows[:-1]]
        assert bounds == sorted(bounds) and all(b > 0 for b in bounds)
        assert all(m in chain.METHODS and m != "reference" for _, m in rows)
    for hv in (1, 8, chain.FEW_HEADS, chain.FEW_HEADS + 1, 48):
        for length in (1, 16, 32, 64, 128, 256, 4096):
            assert chain.choose(length, hv) in chain.METHODS
    table = {"few": ((4, "recurrent"), (None, "chunk")), "many": ((None, "tree_fused"),)}
    assert [chain.choose(t, 8, table) for t in (1, 4, 5)] == ["recurrent", "recurrent", "chunk"]
    assert chain.choose(1000, 48, table) == "tree_fused"


def test_device_choice_and_its_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert chain.chain_method(256, 8, cpu, torch.bfloat16) == "reference"
    table = {"few": ((16, "tree_split"), (None, "chunk")), "many": ((None, "recurrent"),)}
    monkeypatch.setattr(chain, "CHAIN_CHOICE", table)
    monkeypatch.setattr(chain, "_has_fla", lambda: True)
    assert chain.chain_method(16, 8, cuda, torch.bfloat16) == "tree_split"
    assert chain.chain_method(16, 8, cuda, torch.float32) == "chunk"  # split loses in float32
    assert chain.chain_method(16, 48, cuda, torch.float32) == "recurrent"  # the table's own choice stays
    assert chain.chain_method(17, 8, cuda, torch.bfloat16) == "chunk"
    assert chain.chain_method(17, 48, cuda, torch.bfloat16) == "recurrent"
    monkeypatch.setattr(chain, "_has_fla", lambda: False)  # no fla: the tree kernel of the head class
    assert chain.chain_method(17, 8, cuda, torch.bfloat16) == "tree_split"
    assert chain.chain_method(17, 48, cuda, torch.bfloat16) == "tree_fused"
    assert chain.chain_method(16, 8, cuda, torch.float32) == "tree_fused"  # the split kernel's, in float32


def test_unknown_method_is_refused() -> None:
    x = chain_inputs(1, 1, 4, 4, 3, 0)
    with pytest.raises(ValueError, match="unknown chain method"):
        chain.verify_chain(*x, 0.5, method="magic")


def _interpreter_main() -> None:
    """Subprocess entry (TRITON_INTERPRET=1): the tree kernels in chain mode, errors as JSON."""
    torch.set_num_threads(1)
    out = {}
    for method in ("tree_fused", "tree_split"):
        out[f"{method}-fp32"] = method_error(method, (1, 2, 16, 16), 21, 2, "cpu", torch.float32)
        out[f"{method}-bf16"] = method_error(method, (1, 2, 16, 16), 21, 3, "cpu", torch.bfloat16)
    print(json.dumps(out))


@pytest.fixture(scope="module")
def interp() -> dict:
    return run_in_interpreter(__file__)


@pytest.mark.parametrize("method", ["tree_fused", "tree_split"])
def test_tree_kernels_verify_chains_in_the_interpreter(interp: dict, method: str) -> None:
    assert interp[f"{method}-fp32"] < 1e-5  # "ieee" dots, float32 arithmetic
    assert interp[f"{method}-bf16"] < 1e-2  # bf16 inputs and outputs, "tf32" dots


SHAPES = {"specla": (8, 8, 256, 256), "weaver": (16, 48, 128, 128)}  # (H, HV, d_k, d_v)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [16, 64, 256])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_gpu_every_method_at_paper_shapes(shape: str, n: int) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    pytest.importorskip("fla")
    for method in (None, "chunk", "recurrent", "tree_split", "tree_fused"):
        err = method_error(method, SHAPES[shape], n, n, "cuda", torch.bfloat16)
        assert err < 1e-2, (shape, n, method, err)


@pytest.mark.gpu
def test_gpu_default_choice_replays_in_a_cuda_graph() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for shape, n in (("specla", 32), ("weaver", 256)):  # the split tree kernel; (with fla) the chunk kernel
        h, hv, dk, dv = SHAPES[shape]
        x = chain_inputs(h, hv, dk, dv, n, 5)
        q, k, v = (t.to("cuda", torch.bfloat16) for t in x[:3])
        g, beta, state = (t.to("cuda", torch.float32) for t in x[3:])
        eager = chain.verify_chain(q, k, v, g, beta, state, dk**-0.5)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            chain.verify_chain(q, k, v, g, beta, state, dk**-0.5)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain.verify_chain(q, k, v, g, beta, state, dk**-0.5)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager), n


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
