"""Rules and how they apply: the rule language (:mod:`.rule`), the engine's matcher
(:mod:`.match`), the same rules as ``tvm.relax.dpl`` patterns (:mod:`.dpl`) and the numeric
check of a rule on a model (:mod:`.rulecheck`)."""
