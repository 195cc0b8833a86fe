"""The training tasks of ``opsplit train``, one module each, picked by the config's top-level
``task``: :mod:`~opsplit.cli.tasks.digits` (the default: a ViT on the bundled digits),
:mod:`~opsplit.cli.tasks.text` (a character-level GPT) and :mod:`~opsplit.cli.tasks.burgers`
(a neural operator on Burgers' equation).  Each declares its data, model and defaults: its
``SCHEMA`` (the ``[train]`` keys are TrainConfig's fields, the ``[objective]`` keys
Objective's weights, both checked by the library), its cross-key checks, cost estimate,
preparation and run; what they share — the library's checks before anything is written,
interrupts, ``--resume`` — is :mod:`~opsplit.cli.tasks.base`."""

from . import base, burgers, digits, text
from .base import TASKS, Interrupted

__all__ = ["TASKS", "MODULES", "Interrupted", "base", "digits", "text", "burgers"]

#: task name -> its module
MODULES = {name: {"digits": digits, "text": text, "burgers": burgers}[name] for name in TASKS}
