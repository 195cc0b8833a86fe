"""Input validation shared by every public entry point.

Every check raises a ``ValueError`` (or ``TypeError``) whose message names what was
expected and what was received, so that bad input never reaches a matmul.

**Static and value checks.**  Checks of types, ranks, shapes, dtypes and devices are
plain Python on tensor metadata: free, and kept everywhere (also under ``torch.compile``
and ``torch.jit.trace``, where they are evaluated once, at trace time).  Checks of tensor
*values* (finiteness, positivity) need a reduction and a host synchronisation; they run
once per call of a public entry point (a model's or propagator's ``forward``, a public
function), never per substep, and they are skipped while ``torch.compile`` or
``torch.jit`` traces the code (:func:`skip_value_checks`), where a data-dependent Python
branch would break the graph.  A compiled or traced model therefore runs without value
checks: validate inputs eagerly first if they can hold NaN/inf.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "skip_value_checks",
    "check_tensor",
    "check_float_dtype",
    "check_finite",
    "check_state",
    "check_positive_int",
    "check_positive_float",
    "check_finite_float",
    "check_time_step",
    "check_time",
    "check_shape",
    "module_dtype_device",
    "check_like_module",
    "check_parameters_finite",
    "check_positive_values",
    "check_dtype_arg",
    "check_probability",
    "check_generator",
    "check_bool",
    "check_choice",
    "check_int",
]


# (dynamo folds this call to True; torch < 2.3 has no torch.compiler.is_compiling)
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)


def skip_value_checks() -> bool:
    """True while ``torch.compile`` (dynamo) or ``torch.jit`` traces or scripts the code:
    value checks (which need ``bool(tensor)``) are skipped there.  (Called per substep:
    kept to a few fast calls.)"""
    return _is_compiling() or torch._C._get_tracing_state() is not None or torch.jit.is_scripting()


_is_batched = getattr(getattr(torch._C, "_functorch", None), "is_batchedtensor", None) or (
    lambda x: False)


def is_vmapped(x: Tensor) -> bool:
    """True for a tensor batched by ``torch.func.vmap``: its values cannot be read in
    Python (``bool(tensor)`` raises), so value checks are skipped for it, as under
    ``torch.compile``; inputs are validated where they enter the vmapped function."""
    return _is_batched(x)


def check_tensor(x, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    return x


def check_float_dtype(x: Tensor, name: str) -> None:
    if not x.is_floating_point():
        raise TypeError(
            f"{name}: expected a floating-point tensor (float32 or float64), got dtype {x.dtype}"
        )


def check_finite(x: Tensor, name: str, what: str = "") -> None:
    """Raise if ``x`` holds NaN or inf (one reduction, :func:`all_finite`; syncs on CUDA).
    Skipped under ``torch.compile`` / ``torch.jit`` tracing (see the module docstring)."""
    if skip_value_checks() or x.device.type == "meta" or is_vmapped(x):  # no values to read
        return
    if not all_finite(x):
        n_bad = int((~torch.isfinite(x)).sum())
        extra = f" ({what})" if what else ""
        raise ValueError(f"{name}: expected finite values, found {n_bad} NaN/inf entries{extra}")


def check_state(u, grid, name: str = "u", *, finite: bool = True) -> Tensor:
    """Validate a state ``u`` of shape (B, N_x, N_y) against ``grid``."""
    u = check_tensor(u, name)
    check_float_dtype(u, name)
    if u.dim() != 3:
        raise ValueError(
            f"{name}: expected a tensor of shape (B, N_x, N_y) = (B, {grid.nx_str}, {grid.ny_str}) "
            f"(rank 3), got rank {u.dim()} with shape {tuple(u.shape)}"
        )
    for n, what in ((u.shape[-2], "N_x tokens"), (u.shape[-1], "N_y features")):
        if n == 0:
            raise ValueError(
                f"{name}: empty state: expected at least one of the {what}, got shape "
                f"{tuple(u.shape)}"
            )
    grid.check_shape(u.shape[-2:], name)
    if finite:
        check_finite(u, name)
    return u


def check_positive_int(n, name: str) -> int:
    if isinstance(n, Tensor) and n.dim() == 0 and n.dtype in (torch.int64, torch.int32):
        # a size read while torch.jit.trace records the code (shapes are traced as 0-d
        # integer tensors); the trace keeps the value of its example input
        n = int(n)
    if isinstance(n, bool) or not isinstance(n, int) and not (
        isinstance(n, float) and n.is_integer()
    ):
        raise TypeError(f"{name}: expected a positive integer, got {n!r}")
    n = int(n)
    if n < 1:
        raise ValueError(f"{name}: expected a positive integer (>= 1), got {n}")
    return n


def _real(x, name: str) -> float:
    if isinstance(x, (bool, complex, str, bytes)):
        raise TypeError(f"{name}: expected a real number, got {x!r}")
    if isinstance(x, Tensor) and x.numel() != 1:
        raise TypeError(f"{name}: expected a real number, got a tensor of shape {tuple(x.shape)}")
    try:
        return float(x)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a real number, got {x!r}") from None


def check_positive_float(x, name: str, *, allow_zero: bool = False) -> float:
    xf = _real(x, name)
    if not math.isfinite(xf) or (xf < 0 if allow_zero else xf <= 0):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}: expected a finite number {bound}, got {x!r}")
    return xf


def check_finite_float(x, name: str) -> float:
    """A finite real number (NaN and inf are refused)."""
    xf = _real(x, name)
    if not math.isfinite(xf):
        raise ValueError(f"{name}: expected a finite number, got {x!r}")
    return xf


def check_probability(p, name: str) -> float:
    """A dropout probability: a real number with ``0 <= p < 1``."""
    pf = _real(p, name)
    if not 0.0 <= pf < 1.0:
        raise ValueError(f"{name}: expected a probability 0 <= p < 1, got {p!r}")
    return pf


def check_time_step(dt, name: str = "dt"):
    """A time step :math:`\\Delta t`: a finite number > 0 (a Python number is checked;
    a 0-d floating tensor is accepted as is, its value checked outside compilation)."""
    if isinstance(dt, Tensor):
        if dt.numel() != 1 or not dt.is_floating_point():
            raise TypeError(
                f"{name}: expected a number or a 0-d floating tensor, got a {dt.dtype} tensor "
                f"of shape {tuple(dt.shape)}"
            )
        if not skip_value_checks() and not bool(torch.isfinite(dt).all() & (dt > 0).all()):
            raise ValueError(f"{name}: expected a finite time step > 0, got {float(dt)!r}")
        return dt
    if skip_value_checks():  # the time step may be a symbolic float under torch.compile
        return dt
    return check_positive_float(dt, name)


def check_time(t, name: str = "t"):
    """A time: a finite number (a tensor is passed through unchecked).  The compile test
    comes first: under ``torch.compile`` a time may be a symbolic float that
    ``math.isfinite`` cannot read."""
    if isinstance(t, Tensor) or skip_value_checks():  # (a symbolic float under torch.compile)
        return t
    if type(t) is float and math.isfinite(t):  # fast path, called per substep
        return t
    check_finite_float(t, name)
    return t  # unchanged: a LeftLimit keeps its side


def check_dtype_arg(dtype, name: str):
    """A ``dtype=`` factory argument: ``None`` or a floating ``torch.dtype``."""
    if dtype is None:
        return None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(
            f"{name}: expected a floating-point torch.dtype (e.g. torch.float32, torch.float64) "
            f"or None, got {dtype!r}"
        )
    return dtype


def check_generator(generator, name: str):
    """A ``generator=`` argument: ``None`` or a ``torch.Generator``."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"{name}: expected a torch.Generator or None, got {type(generator).__name__}")
    return generator


def check_int(v, name: str, lo=None, allow_none: bool = False):
    """An integer (``bool`` and ``float`` refused: ``TypeError``) ``>= lo`` (``ValueError``),
    returned as a Python ``int`` (NumPy's integers are taken, as ``range`` takes them); ``name``
    is the full argument name used in the message (``"load_digits.seed"``)."""
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name}: expected an integer{'' if lo is None else f' >= {lo}'}"
                        f"{' or None' if allow_none else ''}, got {v!r}")
    v = int(v)
    if lo is not None and v < lo:
        raise ValueError(f"{name}: expected an integer >= {lo}, got {v}")
    return v


def check_bool(v, name: str) -> bool:
    """A flag: ``True`` or ``False`` (not 0 or 1, not a string)."""
    if not isinstance(v, bool):
        raise TypeError(f"{name}: expected true or false, got {v!r}")
    return v


def check_choice(value, choices, name: str):
    """One of ``choices`` (a tuple, or a dict or set, shown sorted), else a ``ValueError``
    naming ``name``."""
    if value not in choices:
        shown = sorted(choices) if isinstance(choices, (dict, set, frozenset)) else choices
        raise ValueError(f"{name}: expected one of {shown}, got {value!r}")
    return value


def check_shape(x: Tensor, expected: Sequence[int], name: str, what: str = "") -> None:
    if tuple(x.shape) != tuple(expected):
        extra = f" ({what})" if what else ""
        raise ValueError(f"{name}: expected shape {tuple(expected)}{extra}, got {tuple(x.shape)}")


def all_finite(x: Tensor) -> bool:
    """Whether ``x`` holds no NaN or inf, by one sum (NaN and inf propagate through it;
    several times cheaper than ``torch.isfinite(x).all()`` on the CPU); only when the sum
    overflows are the entries tested one by one."""
    if x.numel() == 0:
        return True
    if bool(torch.isfinite(x.sum())):
        return True
    return bool(torch.isfinite(x).all())


def module_dtype_device(module: torch.nn.Module):
    """The floating dtype and the device of a module's parameters (else of its
    non-scalar floating buffers), or ``(None, None)`` when it has neither.  0-d buffers
    (numbers given as controls, kept in float64 so that they promote nothing) do not
    count."""
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype, p.device
    for b in module.buffers():
        if b.is_floating_point() and b.dim() > 0:
            return b.dtype, b.device
    return None, None


def check_like_module(x: Tensor, module: torch.nn.Module, name: str, what: str = "the model") -> None:
    """Raise a ``TypeError`` / ``ValueError`` naming ``name`` if ``x`` has another floating
    dtype or another device than ``module``'s parameters."""
    dtype, device = module_dtype_device(module)
    if dtype is None:
        return
    if x.dtype != dtype:
        raise TypeError(
            f"{name}: dtype {x.dtype} differs from {what}'s {dtype} (convert the model with "
            f".to({x.dtype}) or the input with .to({dtype}))"
        )
    if x.device != device and not (x.device.type == device.type and device.index is None):
        raise ValueError(
            f"{name}: device {x.device} differs from {what}'s {device} (move the model with "
            f".to('{x.device}') or the input with .to('{device}'))"
        )


def check_parameters_finite(module: torch.nn.Module, what: str, *, fresh: bool = False) -> None:
    """Raise if a floating parameter or buffer of ``module`` holds NaN/inf, naming it.

    One reduction for all tensors, and only for tensors modified since the last check
    (their version counter or storage changed): a forward after an optimiser step
    checks the parameters once; repeated forwards with the same parameters check
    nothing.  A write through ``p.data`` changes neither, so a caller that found a
    non-finite result asks again with ``fresh=True`` (every tensor read) before blaming
    anything else.  Skipped under ``torch.compile`` / ``torch.jit`` tracing."""
    if skip_value_checks():
        return
    named = [
        (n, t)
        for n, t in list(module.named_parameters()) + list(module.named_buffers())
        if t.is_floating_point() and t.numel() > 0
    ]
    # (inference tensors keep no version counter: a module holding one is checked every time)
    key = None if any(t.is_inference() for _, t in named) else \
        tuple((id(t), t._version, t.data_ptr()) for _, t in named)
    if key is not None and not fresh and getattr(module, "_opsplit_checked_parameters", None) == key:
        return
    if named:
        with torch.no_grad():
            # one sum per tensor first (NaN/inf propagate through it; ~50x cheaper on the CPU than
            # isfinite(t).all() for a model's parameters); only when a sum is not finite (a NaN/inf, or
            # an overflow of the sum) are that tensor's entries tested one by one
            dev, dt = named[0][1].device, named[0][1].dtype
            if all(t.dtype == dt and t.device == dev for _, t in named):
                sums = torch.stack([t.sum() for _, t in named])  # (a sum that overflows: the entries below)
            else:
                sums = torch.stack([t.sum().to(dev, torch.float64) for _, t in named])
            flags = torch.isfinite(sums)
            if not bool(flags.all()):
                flags = torch.stack([torch.isfinite(t).all().to(dev) for _, t in named])
        if not bool(flags.all()):
            bad = [n for (n, _), ok in zip(named, flags.tolist()) if not ok]
            raise ValueError(
                f"{what}: parameters must be finite, but {', '.join(bad)} hold(s) NaN/inf "
                "(a diverged training step, a write through .data, or a non-finite value given at construction)"
            )
    object.__setattr__(module, "_opsplit_checked_parameters", key)


def check_positive_values(owner, values: Tensor | None, name: str, what: str = "sigma_2") -> None:
    """Raise unless every entry of ``values`` (a control's stored values, ``what``) is > 0,
    naming ``name``.  One reduction, and only when ``values`` changed since ``owner`` last passed it
    (another tensor, or its storage or version counter changed): a module checked once per
    solve re-reads a constant only after it is modified.  Skipped for ``None`` and under
    ``torch.compile`` / ``torch.jit`` tracing."""
    if values is None or skip_value_checks():
        return
    slot = "_opsplit_checked_positive_" + name
    key = None if values.is_inference() else (values._version, values.data_ptr())
    hit = owner.__dict__.get(slot)
    if key is not None and hit is not None and hit[0] is values and hit[1] == key:  # (the tensor is kept: its id is not reused)
        return
    if not bool((values > 0).all()):
        raise ValueError(f"{name}: expected {what} > 0, got min {float(values.detach().min()):g}")
    owner.__dict__[slot] = (values, key)


def check_select_index(index, batch_size: int | None, name: str = "index") -> Tensor:
    """The batch rows a cache keeps (``KVCache.select``, ``SlicedDecodeCache.select``): ``index``
    is a 1-D ``torch.int64`` / ``torch.int32`` tensor of row indices in ``[0, batch_size)`` (a
    permutation, a subset, repeats: beam search) or a 1-D bool mask of length ``batch_size``
    (``True`` = keep the row).  Negative indices are refused, not counted from the end (a ``-1``
    is often a "no row" marker).  Returns the rows as a 1-D int64 tensor (on ``index``'s
    device), or raises a ``TypeError`` / ``ValueError`` starting with ``name`` before the caller
    changes anything.  An empty selection (no index, or a mask of ``False``) is refused: a cache
    continues at least one sequence.  ``batch_size=None`` (an empty cache): the range and the
    mask's length are not checked.  Reads the indices' range (one reduction, a host
    synchronisation on an accelerator): once per select, not per token."""
    what = (f"a 1-D tensor of row indices (torch.int64 or torch.int32) in [0, {batch_size})"
            if batch_size is not None else "a 1-D tensor of row indices (torch.int64 or torch.int32)")
    what += " or a 1-D bool mask" + (f" of length {batch_size}" if batch_size is not None else "")
    if not isinstance(index, Tensor):
        raise TypeError(f"{name}: expected {what}, got {type(index).__name__}")
    if index.dtype != torch.bool and index.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name}: expected {what}, got dtype {index.dtype}")
    if index.dim() != 1:
        raise ValueError(f"{name}: expected {what}, got shape {tuple(index.shape)}")
    if index.dtype == torch.bool:
        if batch_size is not None and index.shape[0] != batch_size:
            raise ValueError(f"{name}: a bool mask of length {index.shape[0]}, but the cache holds {batch_size} "
                             f"sequences (expected {what})")
        rows = torch.nonzero(index).flatten()
        if rows.numel() == 0:
            raise ValueError(f"{name}: the mask keeps no sequence; a cache continues at least one (start a new "
                             "cache instead)")
        return rows
    if index.numel() == 0:
        raise ValueError(f"{name}: selects no sequence (an empty index); a cache continues at least one (start a "
                         "new cache instead)")
    rows = index.to(torch.int64)
    lo, hi = (int(x) for x in torch.aminmax(rows))
    if lo < 0 or (batch_size is not None and hi >= batch_size):
        rng = f"[0, {batch_size - 1}]" if batch_size is not None else "[0, B)"
        raise ValueError(f"{name}: row indices must lie in {rng} (negative indices are refused, not counted from "
                         f"the end), got range [{lo}, {hi}]")
    return rows
