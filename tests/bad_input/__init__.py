"""Table-driven bad-input sweep (issue 8): every public constructor and call with wrong
ranks, shapes, grids, sizes, steps, parameters, dtypes, devices, masks and empty input.

Each row is ``(id, callable, exception type, regex)``: the call must raise exactly that
type (or a subclass), the message must match the regex, which names the argument, and
the error must be raised by opsplit's own checks (the innermost frame of the traceback
is in the ``opsplit`` package, not inside torch's compute)."""
