"""The preflight rule book: every known way a recipe fails on real hardware, checked before any host is touched.

Each rule has an id, a title, the source of the fact behind it (docs/sources.md or a public page), a predicate saying
when it applies, and a check returning a `Verdict`: ``pass``, ``fail`` (with a remediation), ``warn`` (a claim the
recipe makes does not hold in full; shown with the numbers, never fatal), ``unknown`` (a fact is missing: the
message says which and where to add it; never a silent pass) or ``skip`` (does not apply).

Host facts come from an Ansible inventory (``--inventory``), per host::

    ds4_kernel: 6.17.0-1032-nvidia          # uname -r
    ds4_rails:                              # per rail of the recipe's fabric
      rail0: {address: 192.168.100.1, mtu: 9000}

Units: GB = 10**9 bytes, GiB = 2**30 bytes; every memory number is printed in both where both appear.

One module per rule family (as ansible-lint keeps one rule per file): `memory`, `capacity`, `speculative`,
`architecture`, `fabric`, `model`, `field_reports`, `serving`, `engine` (what the pinned engine registers), `llamacpp`;
`rulebook` holds the machinery (`Rule`, `Verdict`, `run`).
"""

# Importing a family registers its rules; this order is the rule book's order.
from ds4deploy.plan.preflight import (  # noqa: F401, I001
    memory,
    capacity,
    speculative,
    architecture,
    fabric,
    model,
    field_reports,
    serving,
    engine,
    llamacpp,
)
from ds4deploy.plan.preflight.rulebook import RULES, Report, Rule, Verdict, run

__all__ = ["RULES", "Report", "Rule", "Verdict", "run"]
