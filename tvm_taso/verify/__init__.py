"""Proving rules with Z3 from TASO-style operator properties.

- :mod:`.algebra`: the model of the op table, as a numeric and a Z3 algebra;
- :mod:`.statements`: how an axiom is stated (``Eq``/``Def``/``Fact``) and made a Z3 formula;
- :mod:`.axioms`: the axiom catalogue;
- :mod:`.soundness`: the numeric check of the axioms, run before any proof;
- :mod:`.translate`: a rule as terms of the algebra;
- :mod:`.prover`: proving rules (in worker processes when asked);
- :mod:`.refute`: a concrete counterexample to a rule not proved;
- :mod:`.status`: writing ``proved`` back into rule files.

The command line is :mod:`tvm_taso.cli.rules_verify`.
"""
