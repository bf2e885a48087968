"""Host reads: the places where code waits for a tensor's values on the host.

On a GPU every such read (`tolist`, `item`, `int(t)`, `bool(t)`, `.cpu()`, `.numpy()`, ...) is a
device-to-host transfer that waits for all queued work, and every operation whose output shape
depends on the data (`nonzero`, a boolean mask as an index, `unique`, ...) is a synchronisation
too: a loop that does either often is bound by the host, however fast its kernels. The CPU has no
such transfers, so `HostReads` counts them where they would happen: a `TorchFunctionMode` that sees
every tensor method called under it, on any device. Tests use it to hold a loop to its budget
(one transfer a decoding pass, none in a training step but where figures are logged); it costs a
Python call per torch operation, so it is for counting, never for timing.
"""

from __future__ import annotations

import collections
import sys

import torch
from torch.overrides import TorchFunctionMode

Tensor = torch.Tensor

# reading values into Python: a device-to-host transfer each
_READS = {Tensor.tolist, Tensor.item, Tensor.__int__, Tensor.__float__, Tensor.__bool__, Tensor.__index__,
          Tensor.numpy, Tensor.cpu, Tensor.__format__, Tensor.__repr__, Tensor.__array__}
# operations whose output shape depends on the values: a synchronisation each
_SYNCS = {torch.nonzero, Tensor.nonzero, torch.masked_select, Tensor.masked_select, torch.unique, Tensor.unique,
          torch.argwhere, torch.Tensor.argwhere}
_TORCH_DIR = torch.__file__.rsplit("/", 1)[0]


class HostReads(TorchFunctionMode):
    """Counts host reads (`reads`) and data-dependent synchronisations (`syncs`) made under it, with
    the call sites where they happened (`sites`: "file:line function" -> count; the first frame
    outside torch)."""

    def __init__(self):
        super().__init__()
        self.reads = 0
        self.syncs = 0
        self.sites: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _READS:
            self.reads += 1
            self._note(func)
        elif func in _SYNCS or (func is Tensor.__getitem__ and _bool_index(args)):
            self.syncs += 1
            self._note(func)
        return func(*args, **kwargs)

    def _note(self, func) -> None:
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
            frame = frame.f_back
        where = "?" if frame is None else \
            f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} {frame.f_code.co_name}"
        self.sites[f"{where} ({getattr(func, '__name__', func)})"] += 1


def _bool_index(args) -> bool:
    """Whether a `__getitem__` call indexes with a boolean tensor (a data-dependent shape)."""
    index = args[1] if len(args) > 1 else None
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, Tensor) and i.dtype == torch.bool for i in items)
