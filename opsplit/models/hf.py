r"""Hugging Face ``transformers`` models -> opsplit models: an explicit dispatch on the class.

:func:`from_hf` converts a ``transformers`` model only when its *exact* class is in the
table below; every other class (a subclass included, and every look-alike such as DeiT,
DINOv2, BEiT, I-JEPA, ViTMAE) is refused with a ``TypeError`` that names the class and
lists the supported ones — before any weight is read or any tensor is computed.

The table maps a class name to a converter ``fn(model) -> nn.Module``.  A converter is
responsible for the rest of the contract:

* check, before computing anything, every configuration option and sub-module that changes
  the math (activations, norm types, biases, mask tokens, ...) and refuse what it does not
  recover with a ``ValueError`` (an option) or ``TypeError`` (a sub-module of an
  unexpected class), naming it;
* return a module whose ``forward`` computes what the Hugging Face model computes (to
  round-off), in the same training mode, on the same device and dtype, with the same
  per-parameter ``requires_grad``.

Registering a converter (one line, at import time of the module that defines it)::

    from opsplit.models.hf import register_hf_converter

    register_hf_converter("CvtModel", _cvt_from_hf)          # a function
    @register_hf_converter("CvtForImageClassification")      # or as a decorator
    def _cvt_classifier_from_hf(model): ...

The key is the class name as ``type(model).__name__`` spells it; :func:`from_hf` also
requires ``type(model).__module__`` to be inside ``transformers`` (a user class that only
borrows the name is refused).  Registering a name twice raises unless ``replace=True``.

Registered (see :mod:`opsplit.models.vit`, :mod:`opsplit.models.cvt_hf`,
:mod:`opsplit.models.hf_decoders`): ``ViTModel``, ``ViTForImageClassification``,
``CvtModel``, ``CvtForImageClassification``, and the decoders of
:data:`~opsplit.models.hf_decoders.HF_DECODER_CLASSES`.

The checks the converters share (a sub-module's class, a linear map's sizes, a LayerNorm's
affine parameters, a dropout's rate, one dtype and device) are the private helpers at the
end of this module; the way back of a model whose class has a ``to_hf`` method is registered
here by the module that converts it (:func:`_register_hf_exporter`), so that the model's
module does not import its converter.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

__all__ = ["from_hf", "register_hf_converter", "hf_converters"]

_CONVERTERS: dict[str, Callable[[nn.Module], nn.Module]] = {}


def register_hf_converter(hf_class_name: str, fn: Callable[[nn.Module], nn.Module] | None = None, *,
                          replace: bool = False):
    """Register ``fn`` as the converter of the ``transformers`` class named ``hf_class_name``.

    Returns ``fn``; called without ``fn`` it returns a decorator.  Raises ``ValueError`` if
    the name is already registered (unless ``replace=True``), ``TypeError`` for a non-string
    name or a non-callable converter.
    """
    if not isinstance(hf_class_name, str) or not hf_class_name.isidentifier():
        raise TypeError(f"register_hf_converter: hf_class_name: expected a class name, got {hf_class_name!r}")

    def register(f):
        if not callable(f):
            raise TypeError(f"register_hf_converter: fn: expected a callable, got {type(f).__name__}")
        if hf_class_name in _CONVERTERS and not replace and _CONVERTERS[hf_class_name] is not f:
            raise ValueError(
                f"register_hf_converter: {hf_class_name} already has a converter "
                f"({_CONVERTERS[hf_class_name].__qualname__}); pass replace=True to replace it"
            )
        _CONVERTERS[hf_class_name] = f
        return f

    return register if fn is None else register(fn)


def hf_converters() -> dict[str, Callable[[nn.Module], nn.Module]]:
    """A copy of the table: class name -> converter."""
    return dict(_CONVERTERS)


def from_hf(model):
    """The opsplit model of a Hugging Face ``transformers`` model (same weights, same
    outputs to round-off, training mode, device, dtype and ``requires_grad`` kept).

    Supported classes: the keys of :func:`hf_converters` (``ViTModel``,
    ``ViTForImageClassification``, ``CvtModel``, ``CvtForImageClassification``, and what
    other modules register).  Anything else — a
    subclass, another architecture — raises ``TypeError`` naming the class, before any
    compute; unsupported options of a supported class raise ``ValueError`` naming them.
    """
    supported = ", ".join(sorted(_CONVERTERS)) or "none registered"
    cls = type(model)
    if not isinstance(model, nn.Module):
        raise TypeError(f"from_hf: model: expected a transformers model (nn.Module), got {cls.__name__}; "
                        f"supported: {supported}")
    fn = _CONVERTERS.get(cls.__name__)
    module = getattr(cls, "__module__", "") or ""
    if fn is None or not (module == "transformers" or module.startswith("transformers.")):
        where = f"{module}.{cls.__qualname__}" if module else cls.__qualname__
        why = "" if fn is None else " (a class outside transformers that borrows a supported name)"
        raise TypeError(
            f"from_hf: unsupported model class {cls.__name__} ({where}){why}; opsplit converts exactly "
            f"these transformers classes: {supported}"
        )
    return fn(model)


# -- the way back: opsplit model class -> its exporter ---------------------------------------------
_EXPORTERS: dict[type, Callable[[nn.Module], nn.Module]] = {}


def _register_hf_exporter(cls: type, fn: Callable[[nn.Module], nn.Module]) -> None:
    """Register ``fn(model) -> transformers model`` as what ``cls.to_hf`` calls (one line, at
    import time of the module that converts ``cls``, as :func:`register_hf_converter`)."""
    _EXPORTERS[cls] = fn


def _export_to_hf(model: nn.Module) -> nn.Module:
    """The registered exporter of ``type(model)`` (or of a base class) applied to ``model``."""
    for cls in type(model).__mro__:
        if cls in _EXPORTERS:
            return _EXPORTERS[cls](model)
    raise TypeError(f"to_hf: no Hugging Face exporter is registered for {type(model).__name__}")


# -- checks shared by the converters (before any compute) ------------------------------------------
def _is_hf(obj, *names: str) -> bool:
    """Whether ``obj`` is an instance of the ``transformers`` class of one of ``names`` (exactly)."""
    cls = type(obj)
    return cls.__name__ in names and (cls.__module__ or "").startswith("transformers.")


def _need_hf(obj, where: str, *types) -> None:
    """A ``TypeError`` naming ``where`` unless ``obj`` is exactly one of ``types``: names of
    ``transformers`` classes, or torch classes."""
    names = [t for t in types if isinstance(t, str)]
    classes = tuple(t for t in types if not isinstance(t, str))
    if type(obj) in classes or (names and _is_hf(obj, *names)):
        return
    want = ([f"transformers' {' or '.join(names)}"] if names else []) + [f"nn.{c.__name__}" for c in classes]
    raise TypeError(f"from_hf: {where}: expected {' or '.join(want)}, got {type(obj).__name__}")


def _check_linear(lin, where: str, n_in: int, n_out: int | None = None, *, bias: bool | None = True) -> None:
    """``lin`` is an ``nn.Linear(n_in, n_out)`` (``n_out=None``: any) with a bias or not
    (``bias=None``: either)."""
    _need_hf(lin, where, nn.Linear)
    if lin.in_features != n_in or (n_out is not None and lin.out_features != n_out):
        raise ValueError(
            f"from_hf: {where}: expected nn.Linear({n_in}, {n_out if n_out is not None else '*'}), got "
            f"nn.Linear({lin.in_features}, {lin.out_features})"
        )
    if bias is not None and (lin.bias is not None) != bias:
        raise ValueError(f"from_hf: {where}: expected bias={bias}, got bias={lin.bias is not None}")


def _check_layer_norm(ln, where: str, E: int) -> float:
    """``ln`` is an ``nn.LayerNorm(E)`` with weight and bias; returns its eps."""
    _need_hf(ln, where, nn.LayerNorm)
    if tuple(ln.normalized_shape) != (E,) or ln.weight is None or ln.bias is None:
        raise ValueError(f"from_hf: {where}: expected nn.LayerNorm({E}) with weight and bias, got {ln!r}")
    return float(ln.eps)


def _dropout_p(m, where: str) -> float:
    """The rate of the ``nn.Dropout`` ``m``."""
    _need_hf(m, where, nn.Dropout)
    return float(m.p)


def _one_dtype_device(module, name: str):
    """The one floating dtype and device of ``module``'s parameters and floating buffers (a
    model to convert: ``from_hf``'s, ``from_torch``'s); a ``ValueError`` (several) or
    ``TypeError`` (not floating) naming ``name``."""
    tensors = list(module.parameters()) + [b for b in module.buffers() if b.is_floating_point()]
    kinds = {(t.dtype, t.device) for t in tensors}
    if len(kinds) != 1:
        raise ValueError(f"{name}: parameters on several dtypes/devices {sorted(map(str, kinds))}; "
                         "move it with .to(dtype, device) first")
    dtype, device = kinds.pop()
    if not dtype.is_floating_point:
        raise TypeError(f"{name}: expected floating-point parameters, got {dtype}")
    return dtype, device
