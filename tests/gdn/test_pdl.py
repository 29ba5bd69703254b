"""Programmatic dependent launch (repro.gdn.triton_common.dependent_launch): the switch, and on the GPU a
whole decode step's kernels (GEMVs with their weights loaded before the wait, the GDN core, gated norm,
norms, the LM head's argmax) bitwise equal with and without it."""

from __future__ import annotations

import pytest
import torch

from repro.gdn import triton_common as tc


def test_dependent_launch_switch():
    """dependent_launch stacks and restores; it never applies off CUDA (nor in the interpreter); a launch's
    two arguments always agree."""
    cpu = torch.device("cpu")
    assert tc._pdl == [(True, False, "auto")]  # on by default (no REPRO_PDL here), no early weight loads
    assert not tc.use_pdl(cpu) and tc.pdl_args(cpu) == {"PDL": 0, "launch_pdl": False}
    assert not tc.early_weights(cpu)
    with tc.dependent_launch(False):
        assert tc._pdl[-1] == (False, False, "auto") and not tc.use_pdl(cpu)
        with tc.dependent_launch(early_weights=True, trigger="exit"):
            assert tc._pdl[-1] == (True, True, "exit") and not tc.use_pdl(cpu) and not tc.early_weights(cpu)
        assert tc._pdl[-1] == (False, False, "auto")
    assert tc._pdl == [(True, False, "auto")]
    with pytest.raises(ValueError, match="trigger"), tc.dependent_launch(trigger="end"):
        pass
    assert tc._pdl == [(True, False, "auto")]


def test_trigger_picks_each_kernels_pdl_level(monkeypatch):
    """Where a dependent launch releases the next one: "start" at every kernel's start (PDL 1), "exit" at
    every kernel's exit (2), "gemv" at the GEMVs' start and the other kernels' exit, "auto" at the start
    except for verification kernels and inside verify_launches (exit); off: 0."""
    dev = torch.device("cpu")
    monkeypatch.setattr(tc, "use_pdl", lambda device: tc._pdl[-1].enabled)  # as on a CUDA sm90 device
    # trigger: (other kernel, GEMV, verification kernel, GEMV inside verify_launches)
    expect = {"start": (1, 1, 1, 1), "exit": (2, 2, 2, 2), "gemv": (2, 1, 2, 1), "auto": (1, 1, 2, 2)}
    for trigger, levels in expect.items():
        with tc.dependent_launch(trigger=trigger):
            got = [
                tc.pdl_args(dev)["PDL"],
                tc.pdl_args(dev, gemv=True)["PDL"],
                tc.pdl_args(dev, verify=True)["PDL"],
            ]
            with tc.verify_launches():
                got.append(tc.pdl_args(dev, gemv=True)["PDL"])
            assert tuple(got) == levels, trigger
            assert tc.pdl_args(dev)["launch_pdl"] is True
            assert tc.pdl_args(dev)["PDL"] == levels[0]  # verify_launches restored
        with tc.dependent_launch(False, trigger=trigger), tc.verify_launches():
            assert tc.pdl_args(dev, gemv=True) == {"PDL": 0, "launch_pdl": False}
    assert tc._verifying == [False]


def test_static_decoder_verifies_inside_verify_launches(monkeypatch):
    """StaticDecoder.verify launches its forward inside verify_launches; its decode step does not."""
    from repro.bench.model import build_model
    from repro.models.default import tiny_config
    from repro.models.static import StaticDecoder, TreeSlot
    from repro.tree import Tree

    model = build_model(tiny_config(), torch.device("cpu"), torch.float32, 0)
    dec = StaticDecoder(model, 32, 4)
    seen: list[bool] = []
    forward = dec._forward
    monkeypatch.setattr(
        dec, "_forward", lambda *a, **k: (seen.append(tc._verifying[-1]), forward(*a, **k))[1]
    )
    slot = TreeSlot(dec, 3, max_depth=2)
    slot.set_tree(Tree(torch.tensor([1, 2, 3]), torch.tensor([-1, 0, 0])))
    dec.verify(slot)
    dec.set_token(1)
    dec.decode_step()
    assert seen[0] is True and tc._verifying == [False]
    assert seen[1:] in ([], [False])  # the decode step runs its own path, or _forward outside verification


@pytest.mark.parametrize(
    "value, mode",
    [("0", (False, False, "auto")), ("1", (True, False, "auto")), ("start", (True, False, "start")),
     ("exit", (True, False, "exit")), ("gemv", (True, False, "gemv"))],
)  # fmt: skip
def test_repro_pdl_environment_values(value, mode):
    assert tc._env_mode(value) == mode


def test_repro_pdl_environment_rejects_unknown_values():
    with pytest.raises(ValueError, match="REPRO_PDL must be 0, 1 or one of"):
        tc._env_mode("on")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fuse_decode", [False, True])
def test_gpu_decode_steps_bitwise_equal_with_pdl(fuse_decode: bool):
    """Twelve greedy decode steps of a bf16 hybrid (GDN and attention layers) in one CUDA graph on the
    static decoder's GEMV path: the picks and the last logits are bitwise equal with and without
    programmatic dependent launch (every Triton kernel of the step launched as a dependent), the GEMVs'
    first weight tiles loaded before the wait or after it, the next launch released at each kernel's
    start, exit, or the GEMVs' start only."""
    from repro.bench.model import build_model
    from repro.models.config import ATTENTION, GDN, HybridConfig
    from repro.models.static import StaticDecoder

    cfg = HybridConfig(
        vocab_size=4096, hidden_size=1024, intermediate_size=2816, layer_types=[GDN, GDN, ATTENTION, GDN],
        linear_num_key_heads=8, linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=64,
        num_attention_heads=8, num_key_value_heads=2, head_dim=128,
    )  # fmt: skip
    model = build_model(cfg, torch.device("cuda"), torch.bfloat16, 3)
    model.set_gdn_backend("triton")
    runs = []
    variants = ((False, False, "auto"), (True, False, "start"), (True, True, "start"), (True, False, "exit"),
                (True, False, "gemv"), (True, False, "auto"))  # fmt: skip
    for on, early, trigger in variants:
        with tc.dependent_launch(on, early, trigger):
            dec = StaticDecoder(model, 64, 4, gemv=True, fuse_decode=fuse_decode, fuse_verify=False)
            dec.set_token(11)
            dec.decode_pick()  # compile outside the capture
            dec.load(model.empty_state())
            dec.set_token(11)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            picks = torch.zeros(12, dtype=torch.long, device="cuda")
            with torch.cuda.graph(graph):
                for i in range(12):
                    dec.decode_pick()
                    picks[i : i + 1].copy_(dec.pick)
                    dec.token.copy_(dec.pick)  # the pick is the next token
            dec.load(model.empty_state())
            dec.set_token(11)
            graph.replay()
            torch.cuda.synchronize()
            runs.append((picks.cpu(), dec.decode_step().clone()))
    (picks_off, logits_off), *dependent = runs
    assert torch.isfinite(logits_off.float()).all()
    for picks_on, logits_on in dependent:
        assert torch.equal(picks_off, picks_on) and torch.equal(logits_off, logits_on)
