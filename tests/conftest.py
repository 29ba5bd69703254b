"""Shared test helpers: the repository on sys.path, random draft-tree generators, and a tiny corpus
with a target trained on it (for the drafter training tests)."""

from __future__ import annotations

import contextlib
import os
import random
import sys
import zlib
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `pytest` (unlike `python -m pytest`) does not put the repo root on the path
    sys.path.insert(0, str(ROOT))

from repro.bench.shapes import RANDOM_TREE_KINDS as TREE_KINDS  # noqa: E402,F401
from repro.bench.shapes import random_parents as random_tree  # noqa: E402,F401
from repro.reporting.records import DecodeRecord, git_sha, sha256_ids  # noqa: E402

# GPU cases beyond the default set (kept under ~150 s for the whole gpu-marked suite on an H200)
gpu_full_only = pytest.mark.skipif(
    os.environ.get("REPRO_GPU_FULL") != "1", reason="extended GPU matrix: set REPRO_GPU_FULL=1"
)


def run_in_interpreter(
    test_file: str, flag: str = "--interpret", needs: tuple[str, ...] = ("triton",)
) -> dict:
    """Run ``test_file`` as a script with ``flag`` under Triton's CPU interpreter (TRITON_INTERPRET=1)
    and return the JSON it prints on its last line. This checkout's repro comes first on PYTHONPATH
    (not an installed copy from another checkout), then the environment's (e.g. carried wheels).
    Skips when a module in ``needs`` is missing; fails with the subprocess's stderr when it fails."""
    import importlib.util
    import json
    import subprocess

    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} needed")
    root = str(Path(__file__).resolve().parents[1])
    tests = str(Path(__file__).resolve().parent)  # the test files import their helpers from conftest
    path = os.pathsep.join(p for p in (root, tests, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    proc = subprocess.run(
        [sys.executable, str(Path(test_file).resolve()), flag],
        env=env, capture_output=True, text=True, timeout=600, cwd=root,
    )  # fmt: skip
    if proc.returncode != 0:
        pytest.fail(f"interpreter subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def model64():
    """The untrained seeded default hybrid in float64 (one per test module: tests may change it)."""
    from repro.models.default import build_default_target

    return build_default_target(seed=0, dtype=torch.float64)


def tree_depths(parents: torch.Tensor) -> list[int]:
    depth: list[int] = []
    for p in parents.tolist():
        depth.append(1 if p < 0 else depth[p] + 1)
    return depth


def leaves(parents: torch.Tensor) -> list[int]:
    has_child = set(p for p in parents.tolist() if p >= 0)
    return [i for i in range(parents.numel()) if i not in has_child]


def seed_of(*parts: object) -> int:
    """A deterministic seed from test parameters (``hash`` of a str is salted per process)."""
    return zlib.crc32(repr(parts).encode())


@pytest.fixture
def single_thread():
    """Tiny float64 ops: one intra-op thread is faster and immune to a busy neighbour core."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@contextlib.contextmanager
def sync_debug(mode: str | int = "error"):
    """torch's CUDA sync debug mode ``mode`` inside the block ("error": a host-device sync raises; 0: syncs
    allowed), the previous mode after it (GPU tests that a step never waits on the device)."""
    before = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(before)


WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "to", "red", "house", "by", "sea"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few KB of word salad with one chat document, in the corpus layout (train.txt, heldout.txt)."""
    rng = random.Random(0)
    out = tmp_path_factory.mktemp("corpus")

    def doc() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 60))) + ".\n"

    chat = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nthe cat sat.<|im_end|>\n"
    (out / "train.txt").write_text("".join(d + "<|endoftext|>" for d in [chat] + [doc() for _ in range(50)]))
    (out / "heldout.txt").write_text("".join(doc() + "<|endoftext|>" for _ in range(6)))
    return out


def pytest_configure(config: pytest.Config) -> None:
    """Toy shapes: extra threads only add overhead (and stall when another process is busy). The code
    version runs record is read once (``REPRO_GIT_SHA``, unless given): a run and its resume inside one
    test then agree even when the checkout is edited or committed to meanwhile (a dirty sha names its
    diff); tests of the version rules set their own."""
    torch.set_num_threads(1)
    os.environ.setdefault("REPRO_GIT_SHA", git_sha())


@pytest.fixture(scope="module")
def trained(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A tiny Qwen3.5-layout target trained for 20 steps on ``corpus`` (dir, metrics)."""
    from repro.train.target import TargetRecipe, train_target

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("target")
    kw = dict(steps=20, batch_size=4, seq_len=32, lr=3e-3, warmup=3, device="cpu", eval_sequences=4)
    return out, train_target(TargetRecipe(corpus=str(corpus), out=str(out), **kw))


# A decode run's config and records for the run-directory and report tests
CONFIG = {
    "experiment": "smoke",
    "routes": [{"name": "ar", "kind": "ar"}, {"name": "chain", "kind": "chain"}],
    "max_new_tokens": 32,
    "seed": 7,
}


def make_record(
    route: str = "ar",
    suite: str = "gsm8k",
    prompt_id: str = "p0",
    turn: int = 0,
    accepted: list[int] | None = None,
    output_ids: list[int] | None = None,
    decode_s: float = 1.0,
    kind: str | None = None,
) -> DecodeRecord:
    accepted = [1, 1, 1] if accepted is None else accepted
    new_tokens = 1 + sum(accepted)
    out = list(range(100, 100 + new_tokens)) if output_ids is None else output_ids
    return DecodeRecord(
        route=route,
        route_params={"kind": kind or ("ar" if route == "ar" else "chain")},
        suite=suite,
        prompt_id=prompt_id,
        turn=turn,
        prompt_sha256=sha256_ids([1, 2, 3]),
        prompt_tokens=3,
        new_tokens=new_tokens,
        steps=len(accepted),
        accepted_lengths=accepted,
        tree_sizes=[4] * len(accepted),
        prefill_s=0.01,
        decode_s=decode_s,
        stage_s={"draft": 0.0, "tree": 0.0, "verify": 0.5, "commit": 0.1},
        output_ids=out,
        output_sha256=sha256_ids(out),
        finish_reason="length",
        vs_ar="reference" if route == "ar" else "identical",
        temperature=0.0,
        seed=7,
    )


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``repro ARGS`` in this process: (exit code, stdout, stderr stripped)."""
    from repro.cli import main

    monkeypatch.setattr(sys, "argv", ["repro", *args])
    code = 0
    try:
        main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err.strip()


SMALL_VOCAB = 61


def small_hybrid(seed: int = 0) -> torch.nn.Module:
    """A float64 4-layer hybrid (GDN, attention, GDN, GDN) of width 32, vocabulary SMALL_VOCAB, seeded."""
    from repro.models.config import ATTENTION, GDN, HybridConfig
    from repro.models.default import init_random_weights
    from repro.models.hybrid import HybridLM

    cfg = HybridConfig(
        vocab_size=SMALL_VOCAB, hidden_size=32, intermediate_size=48, layer_types=[GDN, ATTENTION, GDN, GDN],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, partial_rotary_factor=0.5,
    )  # fmt: skip
    return init_random_weights(HybridLM(cfg), seed).to(torch.float64).eval()


def drafting_target(dtype: torch.dtype, device: str = "cpu", seed: int = 5) -> torch.nn.Module:
    """A 3-layer hybrid (GDN, attention, GDN) of width 40 whose head dim 16 the Triton kernels take: the
    drafters' fast-path tests' target."""
    from repro.models.config import ATTENTION, GDN, HybridConfig
    from repro.models.default import init_random_weights
    from repro.models.hybrid import HybridLM

    cfg = HybridConfig(
        vocab_size=SMALL_VOCAB, hidden_size=40, intermediate_size=56, layer_types=[GDN, ATTENTION, GDN],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    )  # fmt: skip
    return init_random_weights(HybridLM(cfg), seed).to(device=device, dtype=dtype).eval()


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 on the CPU."""
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def small_ids(n: int, seed: int) -> list[int]:
    """``n`` seeded token ids below SMALL_VOCAB."""
    return torch.randint(0, SMALL_VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class CountedLaunches:
    """A Triton kernel whose launches are counted and run outside any dispatch mode (the interpreter's
    own torch ops are no aten ops of the step on a GPU): ``module.kernel = CountedLaunches(kernel, n)``."""

    def __init__(self, kernel: object, counter: list[int]) -> None:
        self.kernel, self.counter = kernel, counter

    def __getitem__(self, grid: tuple) -> object:
        from torch.utils._python_dispatch import _disable_current_modes

        def launch(*args: object, **kwargs: object) -> None:
            self.counter[0] += 1
            with _disable_current_modes():
                self.kernel[grid](*args, **kwargs)  # type: ignore[index]

        return launch


@pytest.fixture
def tagged_stores(monkeypatch):  # noqa: ANN001, ANN201
    """graphed.HOST_WRITES's path on the CPU: GraphedTarget's step graphs store their results through
    ``slot_kernels.tagged_to_host`` (stood in by torch ops: the kernel runs on CUDA or in Triton's
    interpreter), the host reading them by their tags. Yields the kinds of what each read waited for."""
    import repro.models.graphed as graphed
    import repro.models.slot_kernels as slot_kernels

    def stand_in(src: torch.Tensor, dst: torch.Tensor, counter: torch.Tensor) -> None:
        tag = slot_kernels.next_tag(int(counter))
        counter.fill_(tag)
        dst[tag % slot_kernels.TAG_ROWS] = (src << slot_kernels.TAG_BITS) | tag

    kinds: list[type] = []
    real_read = graphed.read_back
    monkeypatch.setattr(graphed, "read_back", lambda h, c: kinds.append(type(c)) or real_read(h, c))
    monkeypatch.setattr(graphed.GraphedTarget, "_host_writes", property(lambda self: True))
    monkeypatch.setattr(slot_kernels, "tagged_to_host", stand_in)
    yield kinds
