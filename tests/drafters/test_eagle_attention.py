"""repro/drafters/eagle_attention.py: ``rope_attend`` (rotary, the KV writes and the masked attention in one
launch) against the eager sequence it replaces (``eager_tables`` + ``rope_attend_eager`` of
repro/drafters/eagle_fast.py: the signed-sin rotary, two ``index_copy_`` and ``attend``) and a float64
oracle of the same inputs.

- Interpreter (CPU, TRITON_INTERPRET=1, one subprocess): float32 and bf16, GQA (4 query heads on 2 kv
  heads) and MHA, head dims 16, 32 and 48 (the tiny family's drafter: not a power of two), masks fully
  visible, a draft tree's (committed prefix + ancestors + itself), a row seeing only itself (its slot
  past the first key block: the softmax starts on blocks with nothing visible), slots not contiguous,
  n = 1, 5, 20 and 40 (two query blocks), buffers of 19, 37, 100 and 300 rows, one program per kv head
  and the buffer split over 2 or 3 programs (the partials merged by the last one; the counters left
  zero). float32: output within 1e-5 relative of eager, keys within 1 ulp of the largest key (eager's
  ``addcmul`` may fuse), values bitwise. bf16: keys and values bitwise (the kernel rounds to nearest even
  like torch, also in the interpreter); the output within 1e-2 relative of eager and within 2^-7 of the
  oracle, no farther than eager's own error plus 2^-9 (eager rounds the scores and the softmax to bf16
  before the values' product; the kernel keeps the scores in float32). A row that sees only itself
  returns its own value row exactly (the write is visible to the read in the same launch). The fast
  drafter's proposals with the kernel (float32; its launches counted; also split over programs) equal
  the eager drafter's (the helpers of test_eagle_fast.py).
- CPU, no GPU: the bf16 kernel at its default launch options compiled for sm_90 (triton's ptxas) at both
  drafter shapes: no register spills, the key / value loop pipelined, the split counter's atomic issued by
  one thread.
- GPU (``gpu``): the same cases on CUDA in float32 and bf16 (bf16 keys within 1 ulp: the GPU may fuse the
  rotary's product into an FMA), the fast drafter with the kernel under CUDA graphs equal to the eager
  drafter (float32), and the kernel's bf16 chain distributions within bf16 tolerance of the eager glue's.
"""

from __future__ import annotations

import functools
import json
import sys

import pytest
import torch
from conftest import CountedLaunches, rel, run_in_interpreter
from conftest import drafting_target as small_target

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from test_eagle_fast import PROMPT, shadowed  # noqa: E402

CASES = [  # (heads, kv_heads, head_dim, rows, buffer rows, mask, launch options)
    (4, 2, 16, 5, 37, "tree", {}),
    (4, 2, 16, 1, 19, "full", {}),
    (4, 2, 16, 20, 300, "self", {}),  # 2 programs a kv head (launch_plan), the slots across both
    (4, 2, 16, 40, 100, "tree", {}),
    (4, 2, 16, 20, 100, "tree", {"splits": 3, "block_s": 16}),  # chunks of 48 rows
    (4, 4, 32, 20, 100, "tree", {}),
    (4, 4, 32, 1, 37, "self", {"splits": 4, "block_s": 16}),  # 3 chunks of 16 rows
    (4, 4, 16, 5, 300, "full", {"splits": 1}),
    (4, 2, 48, 5, 37, "tree", {}),  # the tiny family's drafter: head dim 48 (columns padded to 64)
    (4, 2, 48, 20, 300, "tree", {}),
]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def case_inputs(
    heads: int, kv_heads: int, hd: int, n: int, S: int, kind: str, dtype: torch.dtype, device: str
) -> tuple[torch.Tensor, ...]:
    """q|k|v rows, the signed rotary table, positions, keys / values buffers, mask and slots of one case:
    the last rows of the buffer hold a draft region whose slots are shuffled (not contiguous); ``tree``:
    row i sees the committed prefix, a random parent chain among earlier rows and itself."""
    from repro.drafters.fast_rules import rotary_rows, signed_rotary

    g = torch.Generator().manual_seed(n * 1000 + S + heads + kv_heads + hd)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * hd, generator=g)
    keys, values = torch.randn(2, kv_heads, S, hd, generator=g)
    draft = max(n, S // 4)
    slots = (S - draft) + torch.randperm(draft, generator=g)[:n]
    committed = S - draft
    positions = committed - 1 + torch.randint(1, 8, (n,), generator=g)
    mask = torch.zeros(n, S, dtype=torch.bool)
    if kind == "full":
        mask[:] = True
    elif kind == "tree":
        mask[:, :committed] = True
        for i in range(n):
            j = i
            while j >= 0:  # itself, then parents (earlier rows)
                mask[i, slots[j]] = True
                j = int(torch.randint(-1, j, (), generator=g)) if j else -1
    mask[torch.arange(n), slots] = True
    rope = signed_rotary(*rotary_rows(S + 8, hd, 10000.0, torch.float64, torch.device("cpu")))
    on = {"device": device}
    return (
        qkv.to(dtype=dtype, **on), rope.to(dtype=dtype, **on), positions.to(**on),
        keys.to(dtype=dtype, **on), values.to(dtype=dtype, **on), mask.to(**on), slots.to(**on),
    )  # fmt: skip


def eager_attention(qkv, rope_table, positions, keys, values, mask, slots, heads, kv_heads, hd):  # noqa: ANN001, ANN201
    """FastEagle's eager glue: the tables of ``eager_tables``, then ``rope_attend_eager``."""
    from repro.drafters.eagle_fast import eager_tables, rope_attend_eager

    zero = torch.zeros((), dtype=qkv.dtype, device=qkv.device)
    blocked = torch.full((), float("-inf"), dtype=qkv.dtype, device=qkv.device)
    cos, sin, bias = eager_tables(rope_table, positions, mask, heads // kv_heads, zero, blocked)
    return rope_attend_eager(qkv, cos, sin, keys, values, bias, slots, heads, kv_heads, hd)


def kernel_cases(dtype: torch.dtype, device: str) -> dict[str, dict]:
    """Every case of :data:`CASES`: the kernel's output and buffers against eager's and the oracle's."""
    from repro.drafters.eagle_attention import rope_attend

    out = {}
    for heads, kv_heads, hd, n, S, kind, options in CASES:
        inputs = case_inputs(heads, kv_heads, hd, n, S, kind, dtype, device)
        qkv, rope, positions, keys, values, mask, slots = inputs
        shape = (heads, kv_heads, hd)
        ek, ev, gk, gv = keys.clone(), values.clone(), keys.clone(), values.clone()
        ref = eager_attention(qkv, rope, positions, ek, ev, mask, slots, *shape)
        counters = torch.zeros(kv_heads, dtype=torch.int32, device=device)
        got = rope_attend(qkv, rope, positions, gk, gv, mask, slots, *shape, counters, **options)
        ok, ov = keys.double(), values.double()
        exact = eager_attention(qkv.double(), rope.double(), positions, ok, ov, mask, slots, *shape)
        res = {
            "out": rel(got, ref),
            "oracle": rel(got, exact),
            "eager_oracle": rel(ref, exact),
            "keys": float((gk.double() - ek.double()).abs().max() / ek.double().abs().max()),
            "keys_equal": bool(torch.equal(gk, ek)),
            "values_equal": bool(torch.equal(gv, ev)),
            "finite": bool(got.isfinite().all()),
            "counters_zero": bool((counters == 0).all()),
        }
        if kind == "self":  # each query head's output is its own row's value row, exactly
            own = gv[:, slots].transpose(0, 1).repeat_interleave(heads // kv_heads, dim=1)  # [n, heads, hd]
            res["self_exact"] = bool(torch.equal(got.view(n, heads, hd), own))
        out[f"{heads}/{kv_heads}/{hd}/n{n}/S{S}/{kind}/{options.get('splits', 'auto')}"] = res
    return out


def check_kernel_cases(cases: dict[str, dict], dtype: torch.dtype, gpu: bool = False) -> None:
    assert len(cases) == len(CASES)
    for key, r in cases.items():
        assert r["finite"] and r["values_equal"] and r["counters_zero"], (key, r)
        if dtype == torch.float32:
            assert r["out"] <= 1e-5 and r["oracle"] <= 1e-5, (key, r)
            assert r["keys"] <= 2.0**-23, (key, r)
        else:
            assert r["keys_equal"] or (gpu and r["keys"] <= 2.0**-7), (key, r)
            assert r["out"] <= 1e-2 and r["oracle"] <= 2.0**-7, (key, r)
            assert r["oracle"] <= r["eager_oracle"] + 2.0**-9, (key, r)
        if "self_exact" in r:
            assert r["self_exact"], (key, r)
    assert max(r["out"] for r in cases.values()) > 0  # really another computation


def proposal_cases(device: str = "cpu", graphs: bool = False) -> dict[str, dict]:
    """float32 chain and tree: the fast drafter (its attention on the kernel, launches counted) against the
    eager drafter at every proposal (``shadowed``)."""
    from repro.drafters import eagle_attention, eagle_fast
    from repro.drafters.eagle import random_eagle_for

    counter = [0]
    kernel, launcher = eagle_attention._rope_attend_kernel, eagle_fast.rope_attend
    eagle_attention._rope_attend_kernel = CountedLaunches(kernel, counter)
    try:
        model = small_target(torch.float32, device)
        out = {}
        for name, options in (("chain", {}), ("tree", {}), ("tree/splits", {"splits": 3, "block_s": 16})):
            counter[0] = 0
            eagle_fast.rope_attend = functools.partial(launcher, **options)
            kw = {"graphs": True, "capacity": 1024} if graphs else {"capacity": 16}
            drafter = random_eagle_for(model, seed=1)
            res = shadowed(model, [PROMPT], name.split("/")[0], 7, drafter, fast=True, **kw)
            out[name] = {**res, "kernel_launches": counter[0]}
    finally:
        eagle_attention._rope_attend_kernel, eagle_fast.rope_attend = kernel, launcher
    return out


# ------------------------------------------------------------------------------------ interpreter


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_in_interpreter(__file__)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kernel_equals_the_eager_glue_in_the_interpreter(interpreted, dtype):
    check_kernel_cases(interpreted["kernel"][dtype], getattr(torch, dtype))


def test_fast_proposals_with_the_kernel_equal_the_eager_drafters(interpreted):
    for name, res in interpreted["proposals"].items():
        assert res["differ"] == 0 and res["proposals"] >= 5, (name, res)
        assert res["prob_err"] <= 1e-5 and res["kernel_launches"] >= 4 * res["proposals"], (name, res)


# --------------------------------------------------------------------------------------------- CPU


def test_default_and_errors(monkeypatch):
    from repro.drafters import eagle_attention
    from repro.drafters.eagle_attention import fused_attention_default, rope_attend

    cpu = torch.device("cpu")
    monkeypatch.setattr(eagle_attention.triton.knobs.runtime, "interpret", False)
    assert not fused_attention_default(torch.float32, cpu, 16)  # plain CPU: the eager reference
    monkeypatch.setattr(eagle_attention.triton.knobs.runtime, "interpret", True)
    fused = fused_attention_default
    assert fused(torch.float32, cpu, 16) and fused(torch.bfloat16, cpu, 64) and fused(torch.float32, cpu, 48)
    assert not fused(torch.float64, cpu, 16)  # float64 stays eager
    monkeypatch.setattr(eagle_attention.triton.knobs.runtime, "interpret", False)
    cuda_device = torch.device("cuda")
    monkeypatch.setattr(eagle_attention, "CUDA_DEFAULT", False)
    assert not fused(torch.bfloat16, cuda_device, 64)  # on CUDA only with CUDA_DEFAULT
    monkeypatch.setattr(eagle_attention, "CUDA_DEFAULT", True)
    assert fused(torch.bfloat16, cuda_device, 64) and not fused(torch.float64, cuda_device, 64)
    monkeypatch.setattr(eagle_attention.triton.knobs.runtime, "interpret", True)
    assert not fused(torch.float32, cpu, 8) and not fused(
        torch.float32, cpu, 17
    )  # head dims the kernel takes
    args = case_inputs(4, 2, 16, 3, 19, "full", torch.float64, "cpu")
    with pytest.raises(ValueError, match="float32 or half"):
        rope_attend(*args, 4, 2, 16)


def _can_compile_for_cuda() -> bool:
    import os
    from pathlib import Path

    import triton

    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    return os.environ.get("TRITON_INTERPRET") != "1" and ptxas.exists()


def sm90_resources(n: int, S: int, heads: int, kv_heads: int, hd: int, dtype: torch.dtype) -> tuple[str, str]:
    """The launch's kernel (``kernel_constants``' defaults; pointers and strides 16-aligned) compiled for
    sm_90 (no GPU needed): cuobjdump's resource line, the PTX and the TTGIR."""
    import subprocess
    import tempfile
    from pathlib import Path

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from repro.drafters.eagle_attention import _rope_attend_kernel, kernel_constants

    _, _, meta = kernel_constants(n, S, heads, kv_heads, hd, dtype)
    warps = meta.pop("num_warps")
    t = {torch.bfloat16: "*bf16", torch.float32: "*fp32"}[dtype]
    sig = dict(qkv_ptr=t, rope_ptr=t, pos_ptr="*i64", k_ptr=t, v_ptr=t, mask_ptr="*u8", slot_ptr="*i64",
               out_ptr=t, part_ptr="*fp32", stat_ptr="*fp32", ctr_ptr="*i32")  # fmt: skip
    ints = "n S chunk splits s_pos s_slot s_qkv s_rope s_rope_sin s_kh s_ks s_vh s_vs s_mask s_out"
    sig.update(dict.fromkeys(ints.split(), "i32"))
    sig.update(scale="fp32", **dict.fromkeys(meta, "constexpr"))
    strides = ("s_qkv", "s_rope", "s_rope_sin", "s_kh", "s_ks", "s_vh", "s_vs", "s_out")  # multiples of 16
    aligned = [i for i, (k, v) in enumerate(sig.items()) if v.startswith("*") or k in strides]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}  # as the JIT specializes real launches
    src = ASTSource(fn=_rope_attend_kernel, signature=sig, constexprs=meta, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        out = subprocess.run(
            [str(tool), "-res-usage", str(cubin)], capture_output=True, text=True, check=True
        )
    res = next(line.strip() for line in out.stdout.splitlines() if "REG:" in line)
    return res, kernel.asm["ptx"], kernel.asm["ttgir"]


@pytest.mark.skipif(not _can_compile_for_cuda(), reason="needs triton's NVIDIA backend (ptxas)")
@pytest.mark.parametrize(
    ("n", "S", "heads", "kv_heads", "hd"),
    [(32, 2048, 16, 16, 128), (4, 512, 4, 2, 48)],  # GDN-1.3B's EAGLE (8 splits); the tiny family's (2)
)
def test_bf16_kernel_compiles_for_sm90_without_spills(n, S, heads, kv_heads, hd):
    """bf16 at the default launch options: no local memory (register spills), the keys / values loop
    pipelined (asynchronous copies), and the split counter's atomic issued by one thread (its result shared
    through shared memory)."""
    res, ptx, ttgir = sm90_resources(n, S, heads, kv_heads, hd, torch.bfloat16)
    assert "STACK:0 " in res and "LOCAL:0 " in res, res
    assert "async_copy_global_to_local" in ttgir
    atomic = [line for line in ptx.splitlines() if "atom.global.gpu.acq_rel.add" in line]
    assert len(atomic) == 1 and atomic[0].strip().startswith("@%p"), atomic


# ---------------------------------------------------------------------------------------------- GPU


@pytest.fixture
def kernel_on_cuda(monkeypatch):
    """The kernel on CUDA whatever eagle_attention.CUDA_DEFAULT says (these cases decide it)."""
    from repro.drafters import eagle_attention

    monkeypatch.setattr(eagle_attention, "CUDA_DEFAULT", True)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_kernel_equals_the_eager_glue(dtype, kernel_on_cuda):
    cases = kernel_cases(getattr(torch, dtype), "cuda")
    print(json.dumps(cases))
    check_kernel_cases(cases, getattr(torch, dtype), gpu=True)


@pytest.mark.gpu
@cuda
def test_gpu_graphed_fast_proposals_with_the_kernel(kernel_on_cuda):
    """float32 with CUDA graphs (the captured call launches the kernel): the fast drafter's proposals equal
    the eager drafter's at every step."""
    res = proposal_cases("cuda", graphs=True)
    print(json.dumps(res))
    for name, r in res.items():
        assert r["differ"] == 0 and r["prob_err"] <= 1e-5 and r["kernel_launches"] > 0, (name, r)


@pytest.mark.gpu
@cuda
def test_gpu_bf16_kernel_distributions_within_tolerance(kernel_on_cuda):
    """bf16, graphed: a chain proposal's distributions with the kernel and with the eager attention glue
    agree to bf16 accuracy."""
    from repro.drafters.base import DraftContext
    from repro.drafters.eagle import random_eagle_for
    from repro.drafters.static_eagle import StaticEagleDrafter

    model = small_target(torch.bfloat16, "cuda")
    eagle = random_eagle_for(model, seed=1)
    drafters = [StaticEagleDrafter(eagle, model, k=6, fast=True, graphs=True) for _ in range(2)]
    assert drafters[0]._fast.fused_attention
    drafters[1]._fast.fused_attention = False
    ids = list(range(3, 60))
    _, ver = model.prefill(ids, capture=drafters[0].capture_layers)
    probs = []
    for d in drafters:
        d.observe_prefill(ver)
        probs.append(d.propose(DraftContext(ids, [7])).probs.float())
    assert (probs[0] - probs[1]).abs().max().item() < 3e-2


def _interpreter_main() -> None:
    import repro.gdn.triton_common  # noqa: F401 - the interpreter's NumPy patch

    torch.set_num_threads(1)
    kernel = {str(dt)[6:]: kernel_cases(dt, "cpu") for dt in (torch.float32, torch.bfloat16)}
    print(json.dumps({"kernel": kernel, "proposals": proposal_cases()}))


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
