"""The SGLang and vLLM adapters without the engines (no wheel fits CI): they import lazily, fail in
one line when the package is absent, are selectable by name in ``repro falsify external`` (and left
out of the default set when absent), translate the engines' documented responses (fixtures) into
results, and call the engines as documented (fake modules standing in for them)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from repro.engines import catalog, serving
from repro.engines import sglang as sglang_adapter
from repro.engines import vllm as vllm_adapter
from repro.engines.result import EngineRequest, MissingPackageError
from repro.engines.verdicts import verdict

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[2]
IDS = [785, 4226, 374, 220, 19, 17, 13, 151645]
GPU = {"dtype": "bfloat16", "device": "cuda"}  # what the serving adapters defaulted to


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def ns(obj):
    """JSON as attribute objects, the way vLLM's RequestOutput / metrics read."""
    if isinstance(obj, dict):
        return types.SimpleNamespace(**{k: ns(v) for k, v in obj.items()})
    return [ns(v) for v in obj] if isinstance(obj, list) else obj


def test_the_adapters_import_lazily():
    """Importing the catalog and the CLI never imports sglang or vllm (a finder refuses them)."""
    code = (
        "import sys\n"
        "class Refuse:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('sglang', 'vllm'): raise ImportError(name)\n"
        "sys.meta_path.insert(0, Refuse())\n"
        "import repro.cli, repro.engines.catalog, repro.engines.sglang, repro.engines.vllm\n"
        "print('lazy')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.stdout.strip() == "lazy", proc.stderr


@pytest.mark.parametrize(("fn", "package"), [(sglang_adapter.sglang_generate, "sglang"),
                                             (vllm_adapter.vllm_generate, "vllm")])  # fmt: skip
def test_an_absent_package_is_one_line(fn, package):
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed")
    with pytest.raises(MissingPackageError) as exc:
        fn(EngineRequest("/t", None, [1, 2], 4))
    assert str(exc.value) == f"package {package} is not installed: pip install {package}"


def test_named_serving_engines_are_selected_and_absent_ones_left_out_of_the_default():
    chosen = catalog.pick(["sglang-ar", "vllm-ar"])
    assert [e.name for e in chosen] == ["sglang-ar", "vllm-ar"]
    assert {e.drafter for e in catalog.pick(["sglang-dflash", "vllm-eagle"])} == {"dflash", "eagle"}
    default = {e.name for e in catalog.pick(None)}
    for engine in catalog.ENGINES.values():
        if engine.package:
            assert (engine.name in default) == engine.installed
    assert "repro-dflash-chain" in default


def test_falsify_external_records_an_absent_engine_as_not_run(tmp_path):
    if importlib.util.find_spec("sglang") or importlib.util.find_spec("vllm"):
        pytest.skip("an engine is installed")
    from repro.engines.verdicts import run_external_check

    records = run_external_check(
        tmp_path / "ext", ["tiny-qwen35"], ["gsm8k"], 1, 4, engines=["sglang-ar", "vllm-ar"]
    )
    assert [(r.engine, r.vs_ar) for r in records] == [
        ("sglang-ar", "not run: package sglang is not installed: pip install sglang"),
        ("vllm-ar", "not run: package vllm is not installed: pip install vllm"),
    ]
    assert "not run: package sglang" in (tmp_path / "ext" / "report.md").read_text()


def test_sglang_responses_translate_to_results():
    doc = fixture("sglang_response.json")
    spec = sglang_adapter.translate(doc["speculative"], 0.05, "bfloat16")
    assert spec.ok and spec.output_ids == IDS and spec.verify_steps == 3
    assert spec.mal == pytest.approx(8 / 3)  # completion_tokens / spec_verify_ct
    assert (
        verdict(spec, IDS) == "identical" and verdict(spec, IDS[:3] + [0] + IDS[4:]) == "diverged at token 3"
    )
    ar = sglang_adapter.translate(doc["ar"], 0.1, "bfloat16")
    assert ar.ok and ar.verify_steps is None and ar.mal is None
    broken = sglang_adapter.translate({"text": "x", "meta_info": {}}, 0.1, "bfloat16")
    assert broken.status.startswith("refused: SGLang's response has no output_ids")


def test_vllm_outputs_and_counters_translate_to_results():
    doc = fixture("vllm_response.json")
    before, after = (vllm_adapter.counters(ns(doc[k])) for k in ("metrics_before", "metrics_after"))
    res = vllm_adapter.translate(ns(doc["request_output"]), before, after, 0.05, "bfloat16")
    assert res.ok and res.output_ids == IDS and res.verify_steps == 3
    assert res.mal == pytest.approx(1 + 4 / 3)  # 1 + accepted / drafts, differences around the call
    ar = vllm_adapter.translate(ns(doc["request_output"]), before, before, 0.05, "bfloat16")
    assert ar.mal is None and ar.verify_steps is None


class FakeSGLangEngine:
    started: list[dict] = []

    def __init__(self, **kwargs):
        FakeSGLangEngine.started.append(kwargs)

    def generate(self, input_ids, sampling_params):
        assert isinstance(input_ids, list) and sampling_params["temperature"] == 0.0
        assert sampling_params == {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True}
        return fixture("sglang_response.json")["speculative"]

    def shutdown(self):
        pass


def test_sglang_is_called_as_documented_and_its_engine_reused(monkeypatch):
    monkeypatch.setitem(
        sys.modules, "sglang", types.SimpleNamespace(Engine=FakeSGLangEngine, __version__="0.5.0")
    )
    FakeSGLangEngine.started.clear()
    serving.close()
    for _ in range(2):
        res = sglang_adapter.sglang_generate(EngineRequest("/t", "/d", [1, 2, 3], 8, **GPU), drafter="dflash")
        assert res.ok and res.mal == pytest.approx(8 / 3) and res.notes == "sglang 0.5.0, DFLASH"
    assert FakeSGLangEngine.started == [{"model_path": "/t", "dtype": "bfloat16", "random_seed": 0,
                                         "speculative_algorithm": "DFLASH",
                                         "speculative_draft_model_path": "/d"}]  # fmt: skip
    refused = sglang_adapter.sglang_generate(EngineRequest("/t", None, [1], 8, dtype="float64"))
    assert refused.status.startswith("refused: SGLang runs bfloat16, float16, float32 weights, not float64")
    serving.close()


def test_vllm_is_called_as_documented(monkeypatch):
    doc = fixture("vllm_response.json")
    calls: dict = {}

    class FakeLLM:
        def __init__(self, **kwargs):
            calls["llm"] = kwargs
            self.n = 0

        def get_metrics(self):
            self.n += 1
            return ns(doc["metrics_before" if self.n == 1 else "metrics_after"])

        def generate(self, prompts, params, use_tqdm=False):
            calls["prompts"], calls["params"] = prompts, params
            return [ns(doc["request_output"])]

    fake = types.SimpleNamespace(LLM=FakeLLM, SamplingParams=lambda **kw: kw, __version__="0.32.0")
    monkeypatch.setitem(sys.modules, "vllm", fake)
    serving.close()
    res = vllm_adapter.vllm_generate(EngineRequest("/t", "/e", [5, 6], 8, **GPU), drafter="eagle")
    assert res.ok and res.output_ids == IDS and res.mal == pytest.approx(1 + 4 / 3)
    assert calls["llm"]["speculative_config"] == {
        "method": "eagle",
        "num_speculative_tokens": 5,
        "model": "/e",
    }
    assert calls["prompts"] == [{"prompt_token_ids": [5, 6]}]
    assert calls["params"] == {"temperature": 0.0, "max_tokens": 8, "seed": 0, "ignore_eos": True}
    serving.close()
