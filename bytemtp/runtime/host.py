"""Host transfers: the places where the host waits for a device, counted where torch dispatches.

On a GPU three kinds of operation make the host wait for all queued work, and a loop that makes
them often is bound by the host however fast its kernels:
- a read of values into host memory: `item`, `tolist`, `int(t)`, `bool(t)`, `.cpu()`, `.to("cpu")`,
  `copy_` into a host tensor, `torch.equal`, `allclose`: a copy from the device to the host, or an
  op that torch tags `data_dependent_output` (its Python result is a value of the data);
- an op whose output shape depends on the data (torch's `dynamic_output_shape` tag: `nonzero`,
  one-argument `where`, `masked_select`, `unique`, `bincount`; `repeat_interleave` without its
  `output_size`; indexing or index assignment with a boolean mask);
- a synchronous copy from the host to the device: from pageable memory, or without `non_blocking`
  (`torch.tensor(list, device=d)` is one). A copy from pinned memory with `non_blocking` does not wait.

`HostTransfers` is a `TorchDispatchMode` that counts all three on every op torch dispatches, by the
devices of its tensors and torch's own op tags, not by a list of method names. Ops on the host
alone count nothing: the CPU has no transfers. So on a machine without a GPU the loop to count
runs on `runtime.standin`'s stand-in accelerator, where a tensor says it lies on a device and each
of these becomes visible. Tests hold loops to their budgets with it (one read a decoding pass and no
synchronous copy; none in a training step but where figures are logged); `bench decode` reports its
count. It costs a Python call per op: for counting, never for timing.
"""

from __future__ import annotations

import collections
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten
COPIES = {aten._to_copy.default, aten.copy_.default, aten._copy_from.default, aten._copy_from_and_resize.default}
INDEXING = {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}
_TORCH_DIR = torch.__file__.rsplit("/", 1)[0]
PINNED = "_host_pinned"  # set on a host tensor that stands for pinned memory (runtime.standin)


def on_host(t: torch.Tensor) -> bool:
    return t.device.type == "cpu"


def pinned(t: torch.Tensor) -> bool:
    """Whether a host tensor lies in pinned (page-locked) memory."""
    if getattr(t, PINNED, False):
        return True
    try:
        return torch.cuda.is_available() and t.is_pinned()
    except RuntimeError:
        return False


class HostTransfers(TorchDispatchMode):
    """Counts what makes the host wait, made under it: `reads` (device-to-host reads), `syncs`
    (data-dependent shapes) and `copies` (synchronous host-to-device copies), with the call sites
    (`sites`: "file:line function (kind op)" -> count; the first frame outside torch)."""

    def __init__(self):
        super().__init__()
        self.reads = 0
        self.syncs = 0
        self.copies = 0
        self.sites: collections.Counter[str] = collections.Counter()

    @property
    def total(self) -> int:
        return self.reads + self.syncs + self.copies

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = transfer_kind(func, args, kwargs)
        if kind is not None:
            setattr(self, kind, getattr(self, kind) + 1)
            self._note(f"{kind[:-1]} {func.__name__}")
        return func(*args, **kwargs)

    def _note(self, what: str) -> None:
        frame = sys._getframe(2)
        while frame is not None and (frame.f_code.co_filename.startswith(_TORCH_DIR)
                                     or frame.f_code.co_filename == __file__
                                     or frame.f_code.co_filename.endswith("runtime/standin.py")):
            frame = frame.f_back
        where = "?" if frame is None else \
            f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} {frame.f_code.co_name}"
        self.sites[f"{where} ({what})"] += 1


def _copy_kind(func, args, kwargs) -> str | None:
    """A copy's kind: "reads" from the device to the host, "copies" from pageable host memory (or
    without `non_blocking`) to the device, None for a copy that does not wait or a cast in place."""
    if func is aten._to_copy.default:
        if kwargs.get("device") is None:
            return None  # a cast where the tensor lies
        src, dst_host = args[0], torch.device(kwargs["device"]).type == "cpu"
        non_blocking = kwargs.get("non_blocking", False)
    else:
        src, dst_host = args[1], on_host(args[0])
        non_blocking = kwargs.get("non_blocking", len(args) > 2 and args[2])
    if not on_host(src) and dst_host:
        return "reads"
    if on_host(src) and not dst_host and not (non_blocking and pinned(src)):
        return "copies"
    return None


def transfer_kind(func, args, kwargs) -> str | None:
    """"reads", "syncs" or "copies" where the op makes the host wait for a device, else None."""
    if func in COPIES:
        return _copy_kind(func, args, kwargs)
    devices = {t.device.type for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
    if devices <= {"cpu"}:
        return None  # the host alone
    if torch.Tag.data_dependent_output in func.tags:
        return "reads"
    if func in INDEXING:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        indices = [i for i in indices if isinstance(i, torch.Tensor)]
        if any(i.dtype in (torch.bool, torch.uint8) for i in indices):
            return "syncs"
        if any(on_host(i) and i.dim() > 0 for i in indices):
            return "copies"  # host indices travel to the device first
        return None
    if func.overloadpacket is aten.repeat_interleave:
        return None if kwargs.get("output_size") is not None else "syncs"
    if func.overloadpacket is aten.one_hot:
        return None if (args[1] if len(args) > 1 else kwargs.get("num_classes", -1)) >= 0 else "syncs"
    if torch.Tag.dynamic_output_shape in func.tags:
        return "syncs"
    return None
