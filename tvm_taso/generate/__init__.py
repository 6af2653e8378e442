"""The rule generator: TASO's substitution generator, writing tvm-taso's rule language.

``tvm-taso rules generate [--max-ops 3] [--ops ...] [--time-limit S] [-o FILE]``
(:mod:`tvm_taso.cli.rules_generate`); :func:`tvm_taso.generate.driver.generate` from Python.

1. **Enumerate** every graph of up to ``max_ops`` operators over TASO's operator set mapped to
   Relax ops (conv2d 1x1/3x3/1x3/3x1 with and without a fused relu, matmul, add, multiply,
   scalar multiply, relu, concat and split on axes 0/1, transpose, avg/max pool 3x3, enlarge,
   and conv2d 1x1/3x3 with two groups on operands a concat made of two halves)
   on a few small input tensors of *symbolic* sizes (two domains: matrices ``n x k`` / ``k x k``
   and NCHW activations with OIHW kernels), plus TASO's constants (identity matrix, identity
   conv kernel, ones, pooling kernel). Shapes are checked symbolically (every size is a linear
   expression of the symbols), so no two sizes agree by accident. Like TASO, a split only cuts a
   tensor at a boundary that a concat made (the cut point is tracked through the ops).
2. **Fingerprint** each graph's outputs (every output no op of the graph consumes; one or two
   of them; a graph is connected, or two ops of one template on disjoint inputs, as TASO
   records them: the source of ``relu(a), relu(b) => split(relu(concat(a, b)))``) with exact integer arithmetic modulo the prime ``P`` (ReLU replaced by TASO's
   polynomial ``x(x+1)+1``, average pooling as a window sum times the modular inverse of the
   window count, max pooling as the max of residues), group graphs with equal fingerprints and
   pair each with the smallest graph of its group (TASO's pairing), then **confirm** every pair
   with a float64 test on random data using the reference semantics of :mod:`tvm_taso.ir.ops`.
3. **Prune** (counts after each step are reported): identical graphs; TASO's common-subgraph
   test (both sides apply the same op to the same inputs; a fused conv+relu contains its conv)
   and common-supergraph test (same op on both sides over a smaller equivalent pair); input
   renamings (one pair per class of renamings, output orders and add/multiply operand orders;
   a two-output pair that equals itself renamed only reorders outputs and is dropped); graphs
   that recompute a value they already have pair only with inputs alone (``split(concat(a, b))
   = a, b``; TASO drops them outright); pairs the rule language cannot state (TASO's constants
   have no spelling in it); rules whose text repeats another's up to variable names; and rules
   that up to three applications of smaller rules reproduce on an instance, up to the operand
   order of add/multiply (checked with the rule engine itself).
4. **Emit** both directions of each pair by default (``--one-direction``: only smaller graph ->
   larger, the direction TASO stores), each rule general in its shapes: tensor sizes are
   unknowns, the linear constraints both graphs put on them are solved, and only constraints the
   rule engine does not enforce by itself (it checks matmul/conv/concat operands and equal output
   shapes, but add/multiply broadcast) become conditions; a split's cut point is a ``dim``
   expression. Every emitted rule is parsed back and checked numerically on two instances with
   random sizes by matching and applying it with :mod:`tvm_taso.rewrite.match` (proof status
   ``checked``).

Deterministic for a given seed; uses a process pool (2 workers by default).

Modules, in pipeline order: ``search_space`` (domains and operator templates), ``fingerprint``
(integer evaluation), ``enumerate_graphs`` (the enumeration, its graph and pair types),
``shapes`` (symbolic sizes and their equations), ``checks`` (float64 confirmation, rule-engine
instances and checks), ``prune``, ``output`` (rule text and the rule file), ``driver`` (the
pipeline, its process pool and time limit).
"""
