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

Registered (see :mod:`opsplit.models.vit`, :mod:`opsplit.models.cvt`): ``ViTModel``,
``ViTForImageClassification``, ``CvtModel``, ``CvtForImageClassification``.
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
