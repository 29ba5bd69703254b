"""attention_tree with its cache rows split (flash-decoding): ``splits`` S > 1 programs per (key head,
query row block), each over whole blocks of its share of [0, length), then the combine.

- forced S = 1, 2, 3, 4 in the interpreter against the float64 torch path (tests/gdn/test_tree_attention.py's
  reference) for a decode step (n = 1) and a small tree (n = 8): lengths 0, 7 (one block: every split
  but the first empty), 37 (three blocks, the last partial: S = 4 leaves one split empty) and 80 (the whole
  capacity, five blocks); GQA with the output gate (hd 16 and tiny-qwen35's 48) and, in float32, MHA
  without it (18 cases: each dtype at each length, see CASES); float64 to rounding, float32 to ~1e-6,
  bf16 to its rounding; every S against S = 1 (float32: ~1e-6); the nodes' keys bitwise the same for
  every S, the cache untouched;
- the split launch (and its combine) capture-safe (CaptureCheck: no host syncs), 1 launch at S = 1, 2
  above; the host rule for the default S (:func:`repro.gdn.triton_attention.tree_splits`); bad S;
- GPU (``gpu``): the same at tiny-qwen35's and Qwen3.6-27B's attention shapes (n = 1, 16; float32 and
  bf16; S = 1, 2, 3, 4, 33 and the default), and the default split launch captured once in a CUDA graph
  and replayed at two cache lengths (bitwise the eager results at each).
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from conftest import CountedLaunches, run_in_interpreter
from test_tree_attention import DTYPES, SPECS, TOL, case_inputs, rel

ROWS = 80  # cache capacity: five blocks of 16 (the interpreter's block_rows)
LENGTHS = (0, 7, 37, 80)
SPLITS = (1, 2, 3, 4)
# (spec name, tree size, cache length, dtype): every dtype at every length, n = 1 and 8 in each dtype;
# float32's GQA with the gate at every length for n = 1 (and at 80 for n = 8: the cross check's live
# bound), tiny-qwen35's hd 48 and MHA without the gate at two lengths each
CASES = [
    *(("gqa_gate", 8, length, "float64") for length in LENGTHS),
    ("gqa_gate", 1, 37, "float64"),
    *(("gqa_gate", 1, length, "float32") for length in LENGTHS),
    ("gqa_gate", 8, 80, "float32"),
    ("tiny_qwen35", 8, 37, "float32"),
    ("tiny_qwen35", 1, 80, "float32"),
    ("mha_nogate_fullrot", 8, 80, "float32"),
    ("mha_nogate_fullrot", 1, 7, "float32"),
    ("tiny_qwen35", 8, 37, "bfloat16"),
    ("tiny_qwen35", 8, 7, "bfloat16"),
    ("tiny_qwen35", 1, 0, "bfloat16"),
    ("tiny_qwen35", 1, 80, "bfloat16"),
]
CROSS_TOL = {"float64": 1e-12, "float32": 2e-6, "bfloat16": 2e-2}  # S vs S = 1


@torch.no_grad()
def split_case(
    spec: tuple, n: int, length: int, dname: str, device: str, seed: int, rows: int, splits: tuple
) -> dict[str, float]:
    """attention_tree at each of ``splits`` (None: the default S) on one case: the output vs the float64
    torch path (``out_S``), vs S = splits[0] (``cross_S``); keys not bitwise those of splits[0]
    (``k_differs``), the cache written (``untouched``: 0 when not)."""
    from repro.gdn.triton_attention import attention_tree

    case = case_inputs(spec, n, length, DTYPES[dname], device, seed, rows)
    args, (want, want_k) = case["args"], case["want"]
    res: dict[str, float] = {}
    first = None
    for s in splits:
        out, k, _ = attention_tree(*args, splits=s)
        res[f"out_{s}"] = rel(out, want)
        res[f"k_{s}"] = rel(k, want_k)
        if first is None:
            first = out, k
        res[f"cross_{s}"] = rel(out, first[0])
        res["k_differs"] = res.get("k_differs", 0.0) + float(not torch.equal(k, first[1]))
    keys, values = args[5], args[6]
    res["untouched"] = float((keys != case["before"][0]).sum() + (values != case["before"][1]).sum())
    return res


def check_splits(res: dict[str, dict[str, float]]) -> list[str]:
    """Errors over their bounds (the key ends in the dtype); k_differs and untouched must be 0."""
    bad = []
    for key, errs in res.items():
        dname = key.rsplit("/", 1)[1]
        for field, val in errs.items():
            kind = field.split("_")[0]
            bound = {"out": TOL[dname], "k": TOL[dname], "cross": CROSS_TOL[dname]}.get(kind, 0.0)
            if not val <= bound:
                bad.append(f"{key} {field}: {val}")
    return bad


def interpreter_cases() -> dict[str, dict[str, float]]:
    res = {}
    for seed, (name, n, length, dname) in enumerate(CASES, 101):
        key = f"{name}/n{n}/L{length}/{dname}"
        res[key] = split_case(SPECS[name], n, length, dname, "cpu", seed, ROWS, SPLITS)
    return res


def launch_facts() -> dict[str, object]:
    """Launches of one call at S = 1 and S = 3, and CaptureCheck's hazards of the split call."""
    from repro.gdn import triton_attention as ta
    from repro.models.graphs import check_capture

    counter = [0]
    for name in ("_attention_tree_kernel", "_attention_tree_combine_kernel"):
        setattr(ta, name, CountedLaunches(getattr(ta, name), counter))
    args = case_inputs(SPECS["gqa_gate"], 3, 37, torch.float32, "cpu", 7, ROWS)["args"]
    out: dict[str, object] = {}
    for s in (1, 3):
        counter[0] = 0
        ta.attention_tree(*args, splits=s)
        out[f"launches_{s}"] = counter[0]
    out["hazards"] = check_capture(lambda: ta.attention_tree(*args, splits=3)).hazards
    return out


# ------------------------------------------------------------------------------------ interpreter


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_in_interpreter(__file__)


def test_split_kernel_matches_the_torch_path_for_every_split_count(interpreted):
    res = interpreted["cases"]
    assert len(res) == len(CASES) == 18
    assert {(length, dname) for _, _, length, dname in CASES} == {(x, d) for x in LENGTHS for d in DTYPES}
    assert all(f"out_{s}" in errs for errs in res.values() for s in SPLITS)
    assert check_splits(res) == []
    # the bounds are live: bf16 rounds, and S > 1 really changes float32's summation order
    assert res["tiny_qwen35/n8/L37/bfloat16"]["out_1"] > 1e-5
    assert max(res[f"gqa_gate/n{n}/L80/float32"]["cross_3"] for n in (1, 8)) > 0


def test_split_launch_is_capture_safe_and_adds_one_combine(interpreted):
    assert interpreted["launches"] == {"launches_1": 1, "launches_3": 2, "hazards": []}


def test_check_splits_flags_errors():
    assert check_splits(
        {"x/float32": {"out_2": 1e-3, "cross_2": 0.0, "k_differs": 1.0, "untouched": 0.0}}
    ) == [
        "x/float32 out_2: 0.001",
        "x/float32 k_differs: 1.0",
    ]


def test_default_split_rule():
    """One wave over the SMs, at most MAX_SPLITS and one block of the capacity a split; 1 when full."""
    from repro.gdn.triton_attention import MAX_SPLITS, tree_splits

    assert tree_splits(4, 1000, 132) == 33  # Qwen3.6-27B's decode step: 4 key heads x 1 row block
    assert tree_splits(2, 1000, 132) == MAX_SPLITS  # tiny-qwen35's
    assert tree_splits(4, 9, 132) == 9  # a small cache: a block of rows a split
    assert tree_splits(4, 0, 132) == 1
    assert tree_splits(100, 1000, 132) == 1  # the grid already fills the SMs (a large verify)
    assert tree_splits(52, 1000, 132) == 2


def test_default_splits_at_the_model_shapes(monkeypatch):
    """The GPU's (block_m, block_rows, S) for bf16 in a buffer of 8320 rows on an H200 (132 SMs): a decode
    step and a DFlash block split, a large verify does not; interpreted, S = 1 unless forced."""
    from repro.gdn import triton_attention as ta

    cpu = torch.device("cpu")
    monkeypatch.setattr(ta, "interpreting", lambda: True)
    assert ta.tree_blocks(torch.bfloat16, cpu, 1, 24, 4, 256, 8320) == (16, 16, 1)  # interpreted
    assert ta.tree_blocks(torch.bfloat16, cpu, 1, 24, 4, 256, 8320, splits=4)[2] == 4
    monkeypatch.setattr(ta, "interpreting", lambda: False)
    assert ta.tree_blocks(torch.bfloat16, cpu, 1, 24, 4, 256, 8320) == (16, 64, 33)  # 27B decode: 4 x 33
    assert ta.tree_blocks(torch.bfloat16, cpu, 16, 24, 4, 256, 8320) == (16, 64, 5)  # 4 x 6 row blocks
    assert ta.tree_blocks(torch.bfloat16, cpu, 65, 24, 4, 256, 8320)[2] == 1  # 4 x 25 row blocks
    assert ta.tree_blocks(torch.bfloat16, cpu, 1, 4, 2, 48, 8320) == (16, 64, 64)  # tiny decode
    assert ta.tree_blocks(torch.bfloat16, cpu, 1, 24, 4, 256, 200)[2] == 3  # a small buffer: 3 blocks


def test_bad_split_count():
    from repro.gdn.triton_attention import attention_tree

    args = case_inputs(SPECS["gqa_gate"], 1, 5, torch.float64, "cpu", 3, ROWS)["args"]
    for bad in (0, 65):
        with pytest.raises(ValueError, match="splits must be in 1 .. 64"):
            attention_tree(*args, splits=bad)


# ---------------------------------------------------------------------------------------------- GPU

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
GPU_SHAPES = {"tiny_qwen35": SPECS["tiny_qwen35"], "qwen3.6_27b": (24, 4, 256, 0.25, True)}


@pytest.mark.gpu
@needs_cuda
def test_gpu_split_kernel_at_model_shapes():
    """S = 1, 2, 3, 4, 33 and the default at the model shapes, cache capacity 1100, lengths 0, 100, 1000
    (n = 1, 16; float32 and bf16) against the float64 torch path and S = 1."""
    res = {}
    seed = 200
    for dname in ("float32", "bfloat16"):
        for name, spec in GPU_SHAPES.items():
            for n in (1, 16):
                for length in (0, 100, 1000):
                    seed += 1
                    res[f"{name}/n{n}/L{length}/{dname}"] = split_case(
                        spec, n, length, dname, "cuda", seed, 1100, (1, 2, 3, 4, 33, None)
                    )
    print(json.dumps(res, indent=1))
    assert check_splits(res) == []


@pytest.mark.gpu
@needs_cuda
@torch.no_grad()
def test_gpu_split_kernel_replays_in_a_cuda_graph_at_two_lengths():
    """The default (split) launch at Qwen3.6-27B's shape, n = 1 and 16, bf16: captured once, replayed at
    cache lengths 300 and 1000 (the device length changed in place): bitwise the eager call's results."""
    from repro.gdn.triton_attention import attention_tree
    from repro.models.graphs import GraphedCall

    spec = GPU_SHAPES["qwen3.6_27b"]
    for n in (1, 16):
        args = case_inputs(spec, n, 300, torch.bfloat16, "cuda", 5 + n, 1100)["args"]
        length = args[7]
        graphed = GraphedCall(lambda a=args: attention_tree(*a), torch.device("cuda"))
        for value in (300, 1000):
            length.fill_(value)
            want_out, want_k, _ = attention_tree(*args)
            graphed.replay()
            out, k, _ = graphed.output
            assert torch.equal(out, want_out) and torch.equal(k, want_k), (n, value)
            assert rel(out, attention_tree(*args, splits=1)[0]) < 2e-2


def _interpreter_main() -> None:
    import repro.gdn.triton_common  # noqa: F401 - the interpreter's NumPy patch

    torch.set_num_threads(1)
    print(json.dumps({"cases": interpreter_cases(), "launches": launch_facts()}))


if __name__ == "__main__" and "--interpret" in sys.argv:
    _interpreter_main()
