"""The toolchain upgrade gate: versioned policy, A/B proposals, approvals,
backend exceptions and the manifest production code reads.

Models live in ``matrix.models.gate`` (re-exported by ``matrix.models``),
workflows in ``matrix.gate.services``, the pure diff in ``matrix.gate.diff``.
This package imports nothing at load time so ``matrix.models`` can import
the gate models without a cycle.
"""
