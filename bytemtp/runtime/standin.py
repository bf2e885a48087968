"""A stand-in accelerator: on a machine without a GPU, tensors that lie on a device of their own,
so that what only a GPU would show can be seen and tested on the CPU.

On the CPU every tensor lies on one device: a tensor made on a fixed `device="cpu"` meets the
model's without complaint, and a read of values moves nothing. Inside `StandIn()` a device named
`standin` exists (torch's PrivateUse1 backend, registered from Python once a process): a model moved
there (`model.to("standin")`, or `--device standin` on a command run in this context) computes on
the CPU, value for value as on the CPU, but every tensor on it says `device="standin"`, and the rules
of a real accelerator hold:
- an op that mixes a stand-in tensor with a host tensor of one or more dimensions fails, as CUDA's
  "Expected all tensors to be on the same device" (a zero-dimensional host tensor is a scalar there,
  as on CUDA); a random op handed a generator on another device fails too;
- every move between host and device is a real copy that `runtime.host.HostTransfers` counts:
  `.cpu()`, `.to("cpu")`, `tolist`, `item`, `torch.tensor(list, device="standin")`; `pin_memory`
  gives a host tensor that stands for pinned memory, so a `non_blocking` copy from it is free as
  on a GPU.

Each op runs on the host copy each stand-in tensor holds (`Held.held`), under a `TorchDispatchMode`;
autograd, optimizers and the decoding loop run as they are. It is for tests and counting (a Python
call per op), not for speed, and it cannot compile: code run on it keeps its eager or uncompiled
static step. `torch.Generator(device="standin")` gives a CPU generator that says it is on the stand-in
while the context lasts (torch makes no generator for a Python backend).
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from bytemtp.runtime.host import COPIES, INDEXING, PINNED

NAME = "standin"
DEVICE = torch.device(NAME, 0) if torch._C._get_privateuse1_backend_name() == NAME else None
aten = torch.ops.aten
_CROSSING = COPIES | INDEXING  # ops that take host tensors beside device ones (copies; host indices)


def register() -> torch.device:
    """The stand-in device, its backend registered in this process on first use."""
    global DEVICE
    if DEVICE is None:
        name = torch._C._get_privateuse1_backend_name()
        if name != "privateuseone":
            raise RuntimeError(f"the PrivateUse1 backend is taken already ({name!r}): no stand-in device here")
        from torch.utils import backend_registration
        backend_registration._setup_privateuseone_for_python_backend(rename=NAME, backend_module=_Module())
        DEVICE = torch.device(NAME, 0)
    return DEVICE


class _Module:
    """`torch.standin`: one device, whose random draws are the host's (each op runs there)."""

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return 1

    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed_all(self, seed: int) -> None:
        pass  # torch.manual_seed, which calls this, seeds the host's generator itself

    def get_rng_state(self, device=None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device=None) -> None:
        torch.set_rng_state(state)


def is_standin(device) -> bool:
    return torch.device(device).type == NAME


class Held(torch.Tensor):
    """A tensor on the stand-in device: its values in `held`, a host tensor of the same shape."""

    @staticmethod
    def __new__(cls, held: torch.Tensor):
        out = torch.Tensor._make_wrapper_subclass(
            cls, held.shape, strides=held.stride(), storage_offset=held.storage_offset(), dtype=held.dtype,
            device=DEVICE, requires_grad=held.requires_grad, layout=held.layout)
        out.held = held
        return out

    def __repr__(self, *, tensor_contents=None):
        return f"standin({self.held!r})"

    __torch_function__ = torch._C._disabled_torch_function_impl  # `_Functions` sees its calls

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func} on a stand-in tensor outside `StandIn()`")


_HELD_READS = (torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__array__)
_INDEX_METHODS = (torch.Tensor.__getitem__, torch.Tensor.__setitem__)


class _Functions(TorchFunctionMode):
    """What torch does before dispatch, and so not for a Python backend: making a tensor from host
    data on the device, moving a host tensor there, pinning host memory."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _HELD_READS and isinstance(args[0], Held):
            # torch reads no subclass's values itself: the read is a copy to the host, then this
            return func(args[0].cpu(), *args[1:], **kwargs)
        if func is torch.Tensor.data_ptr and isinstance(args[0], Held):  # where the values lie
            return args[0].held.data_ptr()
        if func in _INDEX_METHODS and isinstance(args[0], Held):
            # a list as an index is a host tensor that travels to the device (torch makes it below dispatch)
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            index = tuple(torch.tensor(i, device="cpu") if isinstance(i, list) else i for i in index)
            args = (args[0], index if isinstance(args[1], tuple) else index[0], *args[2:])
        if func in (torch.tensor, torch.as_tensor, torch.asarray) and is_standin(kwargs.get("device") or "cpu"):
            device = kwargs.pop("device")
            return aten._to_copy.default(func(*args, **kwargs), device=torch.device(device))
        if func in (torch.Tensor.to, torch.Tensor.cuda) and not isinstance(args[0], Held):
            device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            if device is not None and is_standin(device):
                return aten._to_copy.default(args[0], device=device, dtype=dtype, non_blocking=non_blocking)
        if func is torch.Tensor.pin_memory:
            out = args[0].clone()
            setattr(out, PINNED, True)
            return out
        if func is torch.Tensor.is_pinned:
            return bool(getattr(args[0], PINNED, False))
        if kwargs.get("generator") is not None:  # below dispatch a generator is a host one again
            _check_generator(func, kwargs["generator"], args, kwargs.get("device"))
        return func(*args, **kwargs)


def _check_generator(func, generator: torch.Generator, args, device) -> None:
    """A random op draws with a generator on the device of the tensor it fills, as CUDA insists."""
    held = any(isinstance(t, Held) for t in tree_flatten(args)[0])
    target = NAME if held or (device is not None and is_standin(device)) else "cpu"
    if is_standin(generator.device) != (target == NAME):
        raise RuntimeError(f"Expected a '{target}' device type for generator but found '{generator.device.type}' "
                           f"({getattr(func, '__name__', func)})")


class _Device(TorchDispatchMode):
    """Every op on stand-in tensors: the device rules checked, then run on the held host tensors."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, spec = tree_flatten((args, kwargs))
        held, host = {}, None
        for t in flat:
            if isinstance(t, Held):
                held[id(t.held)] = t
            elif host is None and isinstance(t, torch.Tensor) and t.dim() > 0:
                host = t
        device = kwargs.get("device")
        to_standin = device is not None and torch.device(device).type == NAME
        if held and host is not None and func not in _CROSSING:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{NAME}:0 and cpu! ({func.__name__}: a host tensor of shape {tuple(host.shape)} "
                               "met the model's)")
        if func is aten.copy_.default:  # into its destination, wherever that lies
            _unwrap(args[0]).copy_(_unwrap(args[1]))
            return args[0]
        to_device = to_standin or (bool(held) and device is None)
        args, kwargs = tree_unflatten([t.held if isinstance(t, Held) else t for t in flat], spec)
        if to_standin:
            kwargs = {**kwargs, "device": torch.device("cpu")}
        out = func(*args, **kwargs)
        if kwargs.get("pin_memory"):
            setattr(out, PINNED, True)
        def wrap(t):
            if not isinstance(t, torch.Tensor):
                return t
            if id(t) in held:  # in place, or the op returned its input: the input itself
                return held[id(t)]
            return Held(t) if to_device else t

        return wrap(out) if isinstance(out, torch.Tensor) else tree_map(wrap, out)


def _unwrap(t):
    return t.held if isinstance(t, Held) else t


class _Generator(torch.Generator):
    """torch.Generator while the stand-in lasts: on the stand-in device, a host generator that says
    it lies there."""

    def __new__(cls, device="cpu"):
        gen = super().__new__(cls, device="cpu")
        gen._on = torch.device(device)
        if is_standin(gen._on):
            gen._on = DEVICE
        return gen

    def __init__(self, device="cpu"):
        pass

    @property
    def device(self):
        return self._on


class _NoGrad:
    """`torch.inference_mode` while the stand-in lasts: inference tensors take no Python subclass
    (torch refuses their views a version counter), so inference runs under no_grad instead, which
    computes the same values."""

    def __init__(self, mode: bool = True):
        self.grad = torch.no_grad() if mode else contextlib.nullcontext()

    def __enter__(self):
        return self.grad.__enter__()

    def __exit__(self, *exc):
        return self.grad.__exit__(*exc)


def modes() -> contextlib.ExitStack:
    """The stand-in's rules for this thread (a thread started inside `StandIn()` enters them itself)."""
    stack = contextlib.ExitStack()
    stack.enter_context(_Device())
    stack.enter_context(_Functions())
    return stack


@contextlib.contextmanager
def StandIn():
    """The stand-in device for the context: `torch.device("standin")` works, a model moved there
    follows an accelerator's rules (module docstring)."""
    register()
    real = torch.Generator, torch._C._InferenceMode
    torch.Generator, torch._C._InferenceMode = _Generator, _NoGrad
    try:
        with modes():
            yield DEVICE
    finally:
        torch.Generator, torch._C._InferenceMode = real
