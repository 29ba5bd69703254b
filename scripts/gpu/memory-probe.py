"""What stays allocated on the GPU after a `repro bench scale` shape, and which code allocated it (CUDA).

    python3 scripts/gpu/memory-probe.py OUT_DIR [SHAPE ...]      (default: tiny gdn-1.3b)

A scale run measures its shapes one after another in one process; a shape's target, drafters, buffers and
graphs should go with it. results/2026-12-05-h100-scale-rows inferred ~52 GiB still allocated after the
Qwen3.6-27B shape (from the next shape's peak, which counts what it started with) and measured 32-96 MiB more
after each tiny one. This runs each SHAPE's default routes through
:func:`repro.bench.scale.measure_shape` (2 prompts x 16 tokens) with torch's allocator history on, then, after
the shape has returned (its objects deleted, the collector run, the cache emptied): the bytes still
allocated (cuBLAS's per-stream workspaces let go: the shape's ``left_gpu_gib``), whether the GraphedTarget
and its decoder are alive (weak references), and the live blocks grouped by the innermost frame of this
repository that allocated them (torch.cuda.memory._snapshot); for a live target, what holds it
(:func:`holders`, :func:`frames_holding`). Writes OUT_DIR/memory-probe.json and prints it.

What it found (results/2026-12-06-h100-scale-memory): every shape's target stayed alive after its shape, held
only by its own cycles (closures over the target among its graphed calls): measure_shape collected while
its loop variable still held the last route, and the cycles then waited for a later collection (56.2 GiB
at the 27B shape). measure_shape now collects after the frame that built them (decode_shape) is gone.
"""

from __future__ import annotations

import gc
import json
import sys
import types
import warnings
import weakref
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's repro, not an installed one

import repro.bench.scale as bs  # noqa: E402
from repro.models.graphed import GraphedTarget  # noqa: E402

MIB = 2**20


def frames_of(block: dict[str, Any]) -> list[dict[str, Any]]:
    if block.get("frames"):
        return block["frames"]
    history = block.get("history") or [{}]
    return history[-1].get("frames") or []


def where(frames: list[dict[str, Any]]) -> str:
    """The innermost frame in this repository (file:line function), else the innermost frame."""
    for f in frames:
        name = str(f.get("filename", ""))
        if "/repro/" in name and "site-packages" not in name:
            return f"{name.split('/repro/', 1)[1]}:{f.get('line')} {f.get('name')}"
    return f"{frames[0].get('filename')}:{frames[0].get('line')}" if frames else "(no frames)"


def live_blocks() -> list[dict[str, Any]]:
    """Allocated blocks: bytes by allocating site, largest first."""
    by: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    for seg in torch.cuda.memory._snapshot()["segments"]:
        for b in seg["blocks"]:
            if b["state"] == "active_allocated":
                key = where(frames_of(b))
                by[key] += b["size"]
                count[key] += 1
    rows = sorted(by.items(), key=lambda kv: -kv[1])
    return [{"site": k, "mib": round(v / MIB, 2), "blocks": count[k]} for k, v in rows[:20]]


def named(obj: Any) -> str:
    """A referrer as type and, for a function, its module and qualified name; for a closure cell, the
    functions that hold it (the 2026-12-06 probe found only "function" and "cell" at the 27B and 1.3B
    shapes)."""
    kind = type(obj).__qualname__
    if callable(obj) and hasattr(obj, "__qualname__"):
        return f"{kind} {getattr(obj, '__module__', '?')}.{obj.__qualname__}"
    if kind == "cell":
        holders = [r for r in gc.get_referrers(obj) if isinstance(r, tuple)]
        funcs = [f for h in holders for f in gc.get_referrers(h) if hasattr(f, "__closure__")]
        return "cell of " + ", ".join(f"{f.__module__}.{f.__qualname__}" for f in funcs[:3])
    return kind


def is_root(o: Any) -> bool:
    """A module's namespace, a module or a class."""
    namespace = isinstance(o, dict) and "__loader__" in o and "__name__" in o
    return namespace or isinstance(o, type | types.ModuleType)


def holders(obj: Any, skip: set[int], limit: int = 3000) -> list[dict[str, Any]]:
    """What keeps ``obj`` alive: the objects above it (its referrers, theirs, ... up to ``limit``; frames and
    ``skip``'s ids left out), each with the references to it that no GC-tracked object accounts for
    (``sys.getrefcount`` minus the tracked referrers: a C extension's, an untracked holder's or a running
    frame's), those with any first, then module namespaces and classes (roots, not looked above)."""
    frame = type(sys._getframe())
    seen: dict[int, Any] = {id(obj): obj}
    order = [obj]
    i = 0
    while i < len(order) and len(order) < limit:
        if is_root(order[i]):  # a module's namespace or a class: what holds it is not the question
            i += 1
            continue
        for r in gc.get_referrers(order[i]):
            if id(r) in seen or id(r) in skip or isinstance(r, frame) or r is order or r is seen:
                continue
            seen[id(r)] = r
            order.append(r)
        i += 1
    rows = []
    for o in order:
        refs = [r for r in gc.get_referrers(o) if not (r is order or r is seen or isinstance(r, frame))]
        external = sys.getrefcount(o) - 4 - len(refs)  # getrefcount's argument, `o`, `order` and `seen`
        is_module_dict = is_root(o)
        if external > 0 or is_module_dict:
            name = str(getattr(o, "__name__", None) or o.get("__name__")) if is_module_dict else repr(o)[:160]
            rows.append({"object": named(o), "external_refs": external, "module_dict": is_module_dict,
                         "detail": name})  # fmt: skip
    rows.sort(key=lambda r: (r["module_dict"], -r["external_refs"]))
    return rows[:40]


def frames_holding(obj: Any) -> list[str]:
    """The frames that reference ``obj`` (this script's left out), each as code, file:line and what holds
    the frame (a traceback, a generator, nothing tracked: running), and tensors whose ``__dict__`` holds it
    (torch does not show a tensor's dict to the collector while C++ shares the tensor)."""
    frame = type(sys._getframe())
    out = []
    for f in gc.get_referrers(obj):
        if isinstance(f, frame) and not f.f_code.co_filename.endswith("memory-probe.py"):
            up = [type(r).__qualname__ for r in gc.get_referrers(f)]
            out.append(f"frame {f.f_code.co_qualname} {f.f_code.co_filename}:{f.f_lineno} held by {up}")
    with warnings.catch_warnings():  # isinstance on deprecated torch names warns
        warnings.simplefilter("ignore")
        tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    for o in tensors:
        if any(v is obj for v in getattr(o, "__dict__", {}).values()):
            out.append(f"tensor {tuple(o.shape)} {o.dtype} whose __dict__ holds it")
    return out


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    shapes = sys.argv[2:] or ["tiny", "gdn-1.3b"]
    dev = torch.device("cuda")
    targets: list[weakref.ref] = []
    decoders: list[weakref.ref] = []
    init = GraphedTarget.__init__

    def spy(self: GraphedTarget, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        targets.append(weakref.ref(self))
        decoders.append(weakref.ref(self.decoder))

    GraphedTarget.__init__ = spy  # type: ignore[method-assign]
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    report: list[dict[str, Any]] = []
    for shape in shapes:
        routes = bs.DEFAULT_ROUTES[shape].split(",")
        cfg = bs.ScaleConfig(shapes=[shape], routes={shape: routes}, acceptance="mal:3", prompts=2,
                             prompt_len=64, max_new_tokens=16, warmup_tokens=4, dtype="bf16")  # fmt: skip
        before = torch.cuda.memory_allocated(dev)
        # measure_shape deletes its objects, collects and lets cuBLAS's workspaces go before it returns
        info = bs.measure_shape(shape, cfg, dev, bs.parse_acceptance(cfg.acceptance), lambda r: None)
        row = {
            "shape": shape,
            "routes": routes,
            "peak_gib": round(info["peak_gpu_gib"], 3),
            "before_mib": round(before / MIB, 1),
            "after_mib": round(torch.cuda.memory_allocated(dev) / MIB, 1),
            "left_gib": round(info["left_gpu_gib"], 3),
            "target_alive": targets[-1]() is not None,
            "decoder_alive": decoders[-1]() is not None,
            "live": live_blocks(),
        }
        if row["target_alive"]:
            t = targets[-1]()
            row["target_referrers"] = [named(r) for r in gc.get_referrers(t)][:24]
            row["holders"] = holders(t, {id(targets), id(decoders), id(report), id(row)})
            row["frames"] = frames_holding(t)
            del t
        report.append(row)
        print(json.dumps(row, indent=1), flush=True)
    (out / "memory-probe.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
