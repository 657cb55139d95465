"""Pure-PyTorch stand-in for SGLang's CPU `sgl_kernel` (kvsim's own code, not SGLang's).

SGLang 0.5.23 with SGLANG_USE_CPU_ENGINE=1 imports a few `*_cpu` helpers from `sgl_kernel` unconditionally, but
the CPU build of sgl-kernel is on no package registry (PyPI has only CUDA wheels, no sdist). This module provides
those helpers in plain torch so the real scheduler, RadixCache and memory pools run; every other name resolves to
a function that raises NotImplementedError when called (so an unexpected code path fails loudly, not silently).

It registers no torch.ops.sgl_kernel ops, so SGLang's `cpu_has_amx_support()` stays False and it uses its torch-native
paths for norms, activations, rotary embedding and attention (`--attention-backend torch_native`).
"""
import ctypes

import torch

__version__ = "0.0.0+kvsim-shim"


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len):
    """req_to_token[req_pool_indices[i], start[i]:end[i]] = the i-th run of out_cache_loc (runs concatenated)."""
    off = 0
    for i in range(req_pool_indices.numel()):
        s, e = int(start_offset[i]), int(end_offset[i])
        n = e - s
        if n > 0:
            req_to_token[int(req_pool_indices[i]), s:e] = out_cache_loc[off:off + n].to(req_to_token.dtype)
        off += n


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For each buffer b (raw base pointer data_ptrs[b], row stride strides[b] bytes): row tgt <- row src."""
    tgt = [int(x) for x in tgt_loc.tolist()]
    src = [int(x) for x in src_loc.tolist()]
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        base, stride = int(base), int(stride)
        rows = [bytes(ctypes.string_at(base + s * stride, stride)) for s in src]  # read all first: in-place safe
        for t, row in zip(tgt, rows):
            ctypes.memmove(base + t * stride, row, stride)


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def _missing(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not provided by the kvsim pure-torch shim")

    _missing.__name__ = name
    return _missing
