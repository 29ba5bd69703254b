"""Helpers of persistent Triton launches (all programs co-resident, grid barriers between stages), shared by
:mod:`repro.gdn.triton_persistent` and Weaver's growth kernel (:mod:`repro.drafters.growth_kernels`): the
grid barrier (:func:`grid_sync`), loads of what another program of the launch wrote (:func:`ld`) and the
co-residency bound on the program count (:func:`resident_ctas`, and for a compiled kernel on a device
:func:`held_programs`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def ld(ptr, mask, CG: tl.constexpr):
    """A masked load (0 elsewhere); CG: cached in L2 only, for what another program of the same launch
    wrote: L1 is per SM and not coherent, and a line read earlier in the launch may be stale."""
    if CG:
        return tl.load(ptr, mask=mask, other=0.0, cache_modifier=".cg")
    return tl.load(ptr, mask=mask, other=0.0)


@triton.jit
def grid_sync(ctr_ptr, err_ptr, target, SPIN: tl.constexpr, LOAD_POLL: tl.constexpr = False):
    """A grid barrier of a persistent launch (every program co-resident): a block barrier (every thread's
    stores issued), then one ``atomic_add(ctr, 1, acq_rel, gpu)`` (its release publishes the block's
    stores) and acquire polls of ``ctr`` until it reaches ``target`` (barrier k of P programs: k P; the
    counter is zeroed before the launch), then a block barrier (the acquire orders the block's later
    loads). A poll past SPIN iterations sets ``err`` and goes on (no hang; the launch's results are not to
    be trusted); a program that finds ``err`` set does not spin. LOAD_POLL: the polls are volatile loads
    (no read-modify-write at the counter's L2 slice) and one acquire atomic follows the last."""
    tl.debug_barrier()
    tl.atomic_add(ctr_ptr, 1, sem="acq_rel", scope="gpu")
    failed = tl.atomic_add(err_ptr, 0, sem="acquire", scope="gpu") != 0
    spins = tl.where(failed, SPIN, 0)
    cur = tl.atomic_add(ctr_ptr, 0, sem="acquire", scope="gpu")
    while (cur < target) & (spins < SPIN):
        if LOAD_POLL:
            cur = tl.load(ctr_ptr, volatile=True)
        else:
            cur = tl.atomic_add(ctr_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    if LOAD_POLL:
        cur = tl.atomic_add(ctr_ptr, 0, sem="acquire", scope="gpu")  # orders the block's later loads
    tl.store(err_ptr, 1, mask=cur < target)
    tl.debug_barrier()


def resident_ctas(regs: int, num_warps: int, shared: int, device: torch.device | None = None) -> int:
    """CTAs of a kernel one SM holds at once (at least 1): ``regs`` registers a thread, allocated per warp
    in units of 256; ``num_warps`` warps; ``shared`` bytes of shared memory a CTA; the SM's registers,
    threads and shared memory from ``device``'s properties (CUDA), else the H100 / H200's (64 K
    registers, 2048 threads, 228 KiB, 32 CTAs). A persistent launch with grid barriers must not ask for
    more than SMs x this."""
    props = torch.cuda.get_device_properties(device) if device is not None and device.type == "cuda" else None
    sm_regs = getattr(props, "regs_per_multiprocessor", 65536)
    sm_threads = getattr(props, "max_threads_per_multi_processor", 2048)
    sm_shared = getattr(props, "shared_memory_per_multiprocessor", 233472)
    per_warp = -(-max(regs, 1) * 32 // 256) * 256
    fit = [sm_regs // (per_warp * num_warps), sm_threads // (32 * num_warps), 32]
    if shared:
        fit.append(sm_shared // (shared + 1024))  # the driver reserves 1 KiB a CTA
    return max(1, min(fit))


def held_programs(binary, num_warps: int, device: torch.device) -> int:  # noqa: ANN001 - a compiled kernel
    """Programs ``device`` holds at once of a compiled Triton kernel (after ``_init_handles``): its SMs x
    :func:`resident_ctas` of the binary's registers and shared memory."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return sms * resident_ctas(binary.n_regs, num_warps, binary.metadata.shared, device)
