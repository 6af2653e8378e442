"""``tvm-taso rules``: ``list`` lives here; ``generate`` and ``verify`` are registered from
:mod:`.rules_generate` and :mod:`.rules_verify`."""

from __future__ import annotations

import re
from collections import Counter


def add_rules_commands(sub) -> None:
    """Register ``rules list`` (and ``rules verify``, ``rules generate``) on the subparsers ``sub``."""
    from tvm_taso.cli.rules_generate import add_generate_command
    from tvm_taso.cli.rules_verify import add_verify_command

    rules = sub.add_parser("rules", help="inspect rule files")
    rsub = rules.add_subparsers(dest="rules_command", required=True)
    ls = rsub.add_parser("list", help="list rules with provenance and proof status")
    ls.add_argument("file", nargs="?", help="a rule file (default: the shipped library)")
    ls.set_defaults(func=cmd_rules_list)
    add_generate_command(rsub)
    add_verify_command(rsub)


def rule_family(name: str) -> str:
    """``gen-merge-conv-12-rev`` -> ``merge-conv``; ``merge-matmul-shared-lhs`` -> ``merge``."""
    if name.startswith("gen-"):
        return re.sub(r"(-\d+)?(-rev)?$", "", name[4:])
    return name.split("-")[0]


def cmd_rules_list(args) -> int:
    import tvm_taso

    rules = tvm_taso.load_rules(args.file) if args.file else tvm_taso.default_rules(include_unverified=True)
    for r in rules:
        print(f"{r.name:40s} {r.provenance:9s} {r.proof:10s} {' + '.join(r.root_ops):30s} {r.where}")
    by = Counter((r.provenance, r.proof) for r in rules)
    families = Counter((r.provenance, rule_family(r.name)) for r in rules)
    print()
    print("by family: " + ", ".join(f"{fam} ({prov}) {n}" for (prov, fam), n in sorted(families.items())))
    print(f"{len(rules)} rules: " + ", ".join(f"{n} {p}/{s}" for (p, s), n in sorted(by.items())))
    return 0
