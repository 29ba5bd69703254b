"""The persistent decode launch (repro.gdn.triton_persistent; StaticDecoder(persistent=True)): every layer of
a pure-GDN decoder for one token in one launch, grid barriers between a layer's five stages.

Interpreter (one TRITON_INTERPRET=1 subprocess, float32; staged launches, the interpreter's way): decode
steps of two small pure-GDN models (d_v 16 with an output gate; d_v 18, K steps of 2, conv bias) against
the pure-torch reference decoder (logits and states within 1e-5) and the separate fused kernels; the
program count changes no bit.
CPU: the configuration rules and the refusals.
GPU (``gpu``): at the GDN-1.3B width (four layers, bf16) the persistent launch equals the staged launches
bitwise (logits, states, conv histories) and the separate GEMV path within bf16 rounding; a CUDA graph of
steps equals eager steps; a spin cap of 0 sets the error flag; float32 greedy picks equal the reference
decoder's.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import run_in_interpreter

from repro.errors import ConfigError
from repro.gdn.triton_persistent import PersistentConfig
from repro.models.config import ATTENTION, GDN, HybridConfig
from repro.models.default import init_random_weights
from repro.models.hybrid import HybridLM
from repro.models.static import StaticDecoder

VOCAB = 61


def _models() -> dict[str, HybridConfig]:
    return {
        "gated": HybridConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=48, layer_types=[GDN] * 3,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=16,
        ),
        "odd": HybridConfig(
            vocab_size=VOCAB, hidden_size=48, intermediate_size=40, layer_types=[GDN] * 2,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=12,
            linear_value_head_dim=18, linear_output_gate=False, linear_conv_bias=True,
        ),
    }  # fmt: skip


def _model(cfg: HybridConfig, dtype: torch.dtype, device: str = "cpu") -> HybridLM:
    return init_random_weights(HybridLM(cfg), 5).to(device=device, dtype=dtype).eval()


def _steps(dec: StaticDecoder, state, tokens: list[int]) -> tuple[list[torch.Tensor], object]:  # noqa: ANN001
    dec.load(state)
    logits = []
    for t in tokens:
        dec.set_token(t)
        logits.append(dec.decode_step().clone())
    return logits, dec.export()


def _diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x.double() - y.double()).abs().max() / y.double().abs().max()) for x, y in zip(a, b))


def _state_diff(a, b) -> float:  # noqa: ANN001
    return max(
        float((u.double() - v.double()).abs().max() / max(1e-30, float(v.double().abs().max())))
        for x, y in zip(a.layers, b.layers)
        for u, v in zip(vars(x).values(), vars(y).values())
        if isinstance(u, torch.Tensor) and u.numel()
    )


def compare(name: str, steps: int, programs: tuple[int, ...]) -> dict:
    """The persistent decoder (staged, on each P) against the reference and the separate fused decoders."""
    model = _model(_models()[name], torch.float32)
    state, _ = model.prefill(torch.arange(5) % VOCAB)
    tokens = [(7 * i + 3) % VOCAB for i in range(steps)]
    ref = _steps(StaticDecoder(model, 32, 4, kernel="reference"), state, tokens)
    sep = _steps(StaticDecoder(model, 32, 4, kernel="triton", gemv=True, fuse_decode=False), state, tokens)
    dec = StaticDecoder(model, 32, 4, kernel="triton", gemv=True, persistent=True)
    assert dec.persistent_gdn is not None and dec.buffers[0].recurrent.data_ptr() == dec.gdn_states.data_ptr()
    runs = []
    for p in programs:
        dec.persistent_gdn.configure(PersistentConfig(programs=p))
        runs.append(_steps(dec, state, tokens))
    (logits, st), *others = runs
    return {
        "vs_reference": _diff(logits, ref[0]),
        "state_vs_reference": _state_diff(st, ref[1]),
        "vs_separate": _diff(logits, sep[0]),
        "programs_bitwise": all(
            all(torch.equal(x, y) for x, y in zip(logits, o[0])) and _state_diff(st, o[1]) == 0
            for o in others
        ),
        "moved": _diff(logits[:1], logits[1:2]) if steps > 1 else 1.0,
    }


@pytest.fixture(scope="module")
def interp() -> dict:
    return run_in_interpreter(__file__)


@pytest.mark.parametrize("name", ["gated", "odd"])
def test_persistent_decode_matches_the_reference(interp: dict, name: str) -> None:
    got = interp[name]
    assert got["vs_reference"] < 1e-5 and got["state_vs_reference"] < 1e-5, got
    assert got["vs_separate"] < 1e-5 and got["programs_bitwise"], got
    assert got["moved"] > 1e-3, got  # the steps' logits differ: the tokens went in


# ----------------------------------------------------------------------------------------------- CPU


def test_config_fits_the_heads_and_refuses_bad_tiles() -> None:
    cfg = PersistentConfig(out_tile=(16, 256), block_v=32)
    assert cfg.fitted(256) == cfg
    assert cfg.fitted(18) == PersistentConfig(out_tile=(16, 2), block_v=32)
    assert cfg.fitted(12).block_v == 16 and cfg.fitted(12).out_tile == (16, 4)
    with pytest.raises(ConfigError, match="powers of two"):
        PersistentConfig(in_tile=(24, 256))
    with pytest.raises(ConfigError, match="positive"):
        PersistentConfig(programs=0)


def test_persistent_refuses_attention_layers_and_the_reference_backend() -> None:
    hybrid = HybridConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, layer_types=[GDN, ATTENTION],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="pure-GDN"):
        StaticDecoder(_model(hybrid, torch.float64), 16, 2, kernel="reference", persistent=True)
    pure = _model(_models()["gated"], torch.float64)
    with pytest.raises(ConfigError, match="fused Triton decoder"):
        StaticDecoder(pure, 16, 2, kernel="reference", persistent=True)


# ----------------------------------------------------------------------------------------------- GPU


def _wide(dtype: torch.dtype) -> HybridLM:
    """Four layers at the GDN-1.3B width (repro.bench.model.gdn_1p3b), random weights on the GPU."""
    from dataclasses import replace

    from repro.bench.model import build_model, gdn_1p3b

    cfg = replace(gdn_1p3b(), layer_types=[GDN] * 4)
    return build_model(cfg, torch.device("cuda"), dtype, 3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_persistent_equals_staged_and_the_separate_kernels() -> None:
    from repro.gdn.triton_persistent import decode_layers

    model = _wide(torch.bfloat16)
    state, _ = model.prefill(torch.arange(9, device="cuda"))
    tokens = [5, 17, 29]
    sep = _steps(StaticDecoder(model, 64, 4, gemv=True, fuse_decode=False), state, tokens)
    dec = StaticDecoder(model, 64, 4, gemv=True, persistent=True)
    pg = dec.persistent_gdn
    assert pg is not None
    persistent = _steps(dec, state, tokens)
    dec.load(state)
    staged = []
    for t in tokens:  # the same step with staged launches
        dec.set_token(t)
        x = model.model.embed_tokens(dec.token)
        decode_layers(pg, x, staged=True)
        staged.append(dec._head(x, True).clone())
    assert all(torch.equal(a, b) for a, b in zip(persistent[0], staged))
    assert _state_diff(persistent[1], dec.export()) == 0
    assert int(pg.error) == 0
    assert _diff(persistent[0], sep[0]) < 2e-2 and _state_diff(persistent[1], sep[1]) < 2e-2
    # a CUDA graph of the steps replays the eager steps' bits
    dec.load(state)
    dec.set_token(tokens[0])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dec.decode_step()
    dec.load(state)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, persistent[0][0])
    # a barrier that may not wait sets the error flag (and nothing hangs)
    pg.spin_cap = 0
    dec.load(state)
    dec.set_token(tokens[0])
    dec.decode_step()
    torch.cuda.synchronize()
    assert int(pg.error) != 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_float32_greedy_picks_equal_the_reference() -> None:
    model = _model(_models()["gated"], torch.float32, "cuda")
    state, _ = model.prefill(torch.arange(6, device="cuda") % VOCAB)
    picks = []
    for dec in (
        StaticDecoder(model, 64, 4, kernel="reference"),
        StaticDecoder(model, 64, 4, kernel="triton", gemv=True, persistent=True),
    ):
        dec.load(state)
        dec.set_token(3)
        got = []
        for _ in range(16):
            dec.decode_pick()
            got.append(int(dec.pick))
            dec.token.copy_(dec.pick)
        picks.append(got)
    assert picks[0] == picks[1]


if __name__ == "__main__" and "--interpret" in sys.argv:
    torch.set_num_threads(1)
    import repro.gdn.triton_common  # noqa: F401 - the interpreter's NumPy patch

    print(json.dumps({"gated": compare("gated", 3, (3, 1)), "odd": compare("odd", 2, (2, 3))}))


@pytest.mark.parametrize("variant", ["default", "l2_vectors_load_poll"])
def test_persistent_kernel_compiles_for_sm90_at_the_gdn_1p3b_shape(variant: str) -> None:
    """The kernel compiled ahead of time for sm_90 (Triton's bundled ptxas, no GPU) with the arguments the
    host passes at the GDN-1.3B shape (meta tensors), what the interpreter cannot check (the compiler's
    rules for jit globals and types): by default (``cached_vectors``) the launch's scratch read with plain
    loads and the barriers' polls acquire atomics; without ``cached_vectors`` and with ``load_poll`` the
    scratch read past L1 (``.cg``) and volatile polls."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from repro.gdn import triton_persistent as tp
    from repro.gdn.triton_decode import GDNDims

    L, d, n1, i, c = 2, 2048, 8208, 5632, 6144

    def meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.empty(*shape, dtype=dtype, device="meta")

    f32 = torch.float32
    other = variant != "default"  # the non-default options: L2-only vectors, volatile polls
    pg = tp.PersistentGDN(
        in_norm=meta(L, d), in_proj=meta(L, n1, d), taps=meta(L, c, 4), conv_bias=None,
        neg_decay=meta(L, 8, dtype=f32), dt_bias=meta(L, 8, dtype=f32), norm_weight=meta(L, 256),
        out_proj=meta(L, d, d), post_norm=meta(L, d), gate_up=meta(L, 2 * i, d), down=meta(L, d, i),
        states=meta(L, 8, 256, 256, dtype=f32), history=meta(L, 3, c),
        conv_index=meta(1, 4, dtype=torch.long), dims=GDNDims(8, 8, 256, 256), has_z=True, beta_scale=1.0,
        eps=1e-6, norm_eps=1e-6, config=PersistentConfig(cached_vectors=not other, load_poll=other),
    )  # fmt: skip
    args, consts = tp._args(pg, meta(1, d))
    warps = consts.pop("num_warps")
    types = {torch.bfloat16: "*bf16", f32: "*fp32", torch.long: "*i64", torch.int32: "*i32"}
    sig = {n: "constexpr" for n in consts}
    for name, a in zip(tp._layers_kernel.arg_names, [*args, 0, L, 132, tp.ALL_STAGES, 1]):
        scalar = "fp32" if isinstance(a, float) else "i32"
        sig[name] = types[a.dtype] if isinstance(a, torch.Tensor) else scalar
    src = ASTSource(fn=tp._layers_kernel, signature=sig, constexprs=consts)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps}).asm["ptx"]
    assert "atom.global.gpu.acq_rel.add" in ptx  # the barrier's arrival
    assert ("ld.global.cg" in ptx) == other and ("ld.volatile.global" in ptx) == other, variant
