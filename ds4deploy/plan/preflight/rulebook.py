"""The rule book's machinery: `Rule`, `Verdict`, the registry `RULES` filled by `rule`, and `run`.

Rules live one family per module beside this one; ``ds4deploy.plan.preflight`` imports them in rule-book order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ds4deploy.recipe.instances import GIB_PER_GB
from ds4deploy.recipe.schema import Recipe


@dataclass(frozen=True)
class Verdict:
    """The outcome of one rule: status, the numbers behind it, what to do, and where the rule comes from."""

    rule: str
    status: str  # pass | fail | warn (shown, not fatal) | unknown | skip
    numbers: str
    remediation: str
    source: str


@dataclass(frozen=True)
class Rule:
    """A preflight rule. `check(recipe, hosts)` returns (status, numbers, remediation)."""

    id: str
    title: str
    source: str
    applies: Callable[[Recipe], bool]
    check: Callable[[Recipe, dict[str, dict]], tuple[str, str, str]]


RULES: list[Rule] = []


def rule(id_: str, title: str, source: str, applies: Callable[[Recipe], bool]):
    """Register a rule (decorator)."""

    def wrap(fn):
        RULES.append(Rule(id_, title, source, applies, fn))
        return fn

    return wrap


def _spec_k(r: Recipe) -> int:
    return r.serving.speculative.num_speculative_tokens if r.serving.speculative else 0


def _gib(gb: float) -> float:
    return gb * GIB_PER_GB


# Rules that hold whichever engine family serves (the host, the fabric, pins, the serving surface); every other rule
# is about vLLM (its parallel world size, memory fraction, CUDA graphs, torch arch list, forks) and does not apply to
# a llama.cpp recipe, whose own rules carry the ``llamacpp-`` prefix.
FAMILY_NEUTRAL = frozenset({
    "v100-cuda12", "cuda-one-toolkit", "rails-distinct-subnets", "rails-mtu-recipe", "rails-mtu-hosts",
    "rails-addresses", "nccl-ib-hca-twins", "kernel-known-bad", "model-pin", "image-pins", "bench-max-tokens",
    "rdma-memlock", "multinode-socket-ifname", "output-cap", "front-door-ports",
})


def applies_to_family(rule_id: str, recipe: Recipe) -> bool:
    """Whether rule `rule_id` speaks about `recipe`'s engine family (`FAMILY_NEUTRAL`)."""
    if recipe.engine.family == "vllm":
        return not rule_id.startswith("llamacpp-")
    return rule_id in FAMILY_NEUTRAL or rule_id.startswith("llamacpp-")


def run(recipe: Recipe, hosts: dict[str, dict] | None = None) -> list[Verdict]:
    """Every rule against `recipe` (and host facts when given), in rule-book order."""
    out = []
    for r in RULES:
        if not applies_to_family(r.id, recipe):
            out.append(Verdict(r.id, "skip", f"not a rule of the {recipe.engine.family} family", "", r.source))
            continue
        if not r.applies(recipe):
            out.append(Verdict(r.id, "skip", "does not apply", "", r.source))
            continue
        status, numbers, fix = r.check(recipe, hosts or {})
        out.append(Verdict(r.id, status, numbers, fix, r.source))
    return out


@dataclass
class Report:
    """Verdicts of one recipe; `exit_code` is 1 when any rule failed, else 0."""

    recipe: str
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if any(v.status == "fail" for v in self.verdicts) else 0
