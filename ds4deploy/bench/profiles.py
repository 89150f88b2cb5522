"""Benchmark profiles: which cells to measure, with which sampling, laid out like which reference table.

Profiles are data: ``ds4deploy/data/bench_profiles/<name>.yaml``, validated by `Profile`. A profile lists its cells
either as a `grid` (the cross product of prompt lengths, concurrencies, content types and thinking modes) or as
explicit `cells` (the reference tables measure only some combinations, e.g. 131,072 x 4 in
docs/sources.md#gx10-context-table). `expand` turns a profile into concrete `CellSpec`s for one recipe and refuses cells
the recipe cannot serve.
"""

from __future__ import annotations

from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ds4deploy.bench.clocks import ClockSweep
from ds4deploy.bench.prompts import CONTENT_TYPES
from ds4deploy.core.errors import UserError
from ds4deploy.core.yamlio import parse_strict, read_text
from ds4deploy.recipe.schema import Recipe

ContentType = Literal["code", "json", "legal", "prose", "chat"]


class Span(BaseModel):
    """A geometric series ``from, from*factor, ...`` up to `to`; ``to: max`` means the recipe's limit (prompt
    tokens: max_model_len - max_tokens; concurrency: max_num_seqs), which is then included as the last point."""

    model_config = ConfigDict(extra="forbid")

    from_: int = Field(alias="from", ge=1)
    to: int | Literal["max"]
    factor: int = Field(default=2, ge=2)

    def values(self, limit: int) -> list[int]:
        """The series, capped at `limit` (the recipe's), with `limit` itself appended for ``to: max``."""
        top = limit if self.to == "max" else self.to
        out, v = [], self.from_
        while v <= top:
            out.append(v)
            v *= self.factor
        if self.to == "max" and top >= self.from_ and (not out or out[-1] != top):
            out.append(top)
        return out


class CellSpec(BaseModel):
    """One benchmark cell: `concurrency` sessions sending `prompt_tokens`-token prompts of one content type.
    `thinking` True/False is sent as ``chat_template_kwargs``; None sends nothing (the server's default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tokens: int = Field(ge=1)
    concurrency: int = Field(default=1, ge=1)
    content: ContentType = "prose"
    thinking: bool | None = None

    @property
    def cell_id(self) -> str:
        """File-name-safe id, e.g. ``p8192-c1-code-think``."""
        think = {True: "-think", False: "-nothink", None: ""}[self.thinking]
        return f"p{self.prompt_tokens}-c{self.concurrency}-{self.content}{think}"


class Grid(BaseModel):
    """Cross product of the listed values."""

    model_config = ConfigDict(extra="forbid")

    prompt_tokens: list[int] | Span
    concurrency: list[int] | Span = Field(default_factory=lambda: [1])
    content: list[ContentType] = Field(default_factory=lambda: ["prose"])
    thinking: list[bool | None] = Field(default_factory=lambda: [None])


class Profile(BaseModel):
    """A named set of cells and how to send them.

    `max_tokens` None takes the recipe's ``benchmark.max_tokens`` (default 2,048,
    docs/sources.md#gx10-benchmark-method); it is always sent.
    `requests_per_session` is how many requests each of a cell's sessions sends in turn (cell requests =
    concurrency x requests_per_session). `layout` picks the markdown table: ``content`` (docs/sources.md#v100x8-table:
    rows = prompt length, a decode column per content type), ``context``
    (docs/sources.md#gx10-context-table: rows = prompt x concurrency) or ``cells``
    (one row per cell, every column) or ``clocks`` (docs/sources.md#gx10-clock-caps, for a
    `clock_sweep` profile).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str
    source: str = Field(min_length=3, description="the reference table or reason this profile reproduces")
    layout: Literal["content", "context", "cells", "clocks"] = "cells"
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    ignore_eos: bool = Field(default=False, description="vLLM extension: decode exactly max_tokens tokens")
    requests_per_session: int = Field(default=2, ge=1)
    warmup_requests: int = Field(default=1, ge=0)
    grid: Grid | None = None
    cells: list[CellSpec] = Field(default_factory=list)
    clock_sweep: ClockSweep | None = Field(default=None, description="measure every cell at each GPU clock cap "
                                           "(ds4deploy.bench.clocks; needs --yes)")

    @model_validator(mode="after")
    def _one_form(self) -> Profile:
        if (self.grid is None) == (not self.cells):
            raise ValueError("a profile has either `grid` or `cells`, exactly one of them")
        return self


def profile_names() -> list[str]:
    """Names of the bundled profiles."""
    d = resources.files("ds4deploy.data").joinpath("bench_profiles")
    return sorted(p.name[:-5] for p in d.iterdir() if p.name.endswith(".yaml"))


def load_profile(name: str) -> Profile:
    """The bundled profile `name`, or a profile YAML at path `name`.

    Raises:
        UserError: no such profile, or it does not validate (the message lists each bad key).
    """
    from pathlib import Path

    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        text = read_text(name, "benchmark profile")
    else:
        f = resources.files("ds4deploy.data").joinpath(f"bench_profiles/{name}.yaml")
        if not f.is_file():
            raise UserError(f"no benchmark profile named '{name}'",
                            f"use one of: {', '.join(profile_names())}, or a path to a profile YAML")
        text = f.read_text("utf-8")
    doc = parse_strict(text, f"benchmark profile '{name}'")
    try:
        return Profile.model_validate(doc.data)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(x) for x in e['loc'])} (line {doc.line_of(e['loc'])}): {e['msg']}"
                 for e in exc.errors()]
        raise UserError(f"benchmark profile '{name}' is invalid:\n" + "\n".join(lines),
                        "fix the profile (schema: ds4deploy/bench/profiles.py)") from None


def effective_max_tokens(profile: Profile, recipe: Recipe) -> int:
    """max_tokens sent with every request: the profile's, else the recipe's benchmark.max_tokens, else 2,048
    (docs/sources.md#gx10-benchmark-method: without it a thinking request generated for 2 h 45 min)."""
    return profile.max_tokens or recipe.benchmark.max_tokens or 2048


def expand(profile: Profile, recipe: Recipe) -> list[CellSpec]:
    """The profile's cells for `recipe`, in run order (short prompts and low concurrency first).

    Raises:
        UserError: a cell's prompt plus max_tokens exceeds the recipe's max_model_len (names the cell and the
            limit), or a `to: max` series is empty for this recipe.
    """
    max_tokens = effective_max_tokens(profile, recipe)
    limit = recipe.serving.max_model_len - max_tokens
    if profile.grid is not None:
        g = profile.grid
        prompts = g.prompt_tokens.values(limit) if isinstance(g.prompt_tokens, Span) else g.prompt_tokens
        concs = (g.concurrency.values(recipe.serving.max_num_seqs) if isinstance(g.concurrency, Span)
                 else g.concurrency)
        if not prompts or not concs:
            raise UserError(f"profile '{profile.name}' has no cells for recipe '{recipe.name}' (max_model_len "
                            f"{recipe.serving.max_model_len}, max_tokens {max_tokens})",
                            "lower the profile's max_tokens or its smallest prompt length")
        cells = [CellSpec(prompt_tokens=p, concurrency=c, content=ct, thinking=t)
                 for t in g.thinking for ct in g.content for p in prompts for c in concs]
    else:
        cells = list(profile.cells)
    too_long = [c for c in cells if c.prompt_tokens + max_tokens > recipe.serving.max_model_len]
    if too_long:
        worst = max(too_long, key=lambda c: c.prompt_tokens)
        raise UserError(
            f"profile '{profile.name}' asks for {len(too_long)} cell(s) longer than recipe '{recipe.name}' serves: "
            f"e.g. {worst.cell_id}: {worst.prompt_tokens} prompt + {max_tokens} max_tokens > max_model_len "
            f"{recipe.serving.max_model_len}",
            "use a profile made for this recipe (`ds4deploy bench profiles`), e.g. `context-sweep`, whose "
            "lengths follow the recipe's max_model_len")
    for c in cells:
        assert c.content in CONTENT_TYPES
    seen: set[str] = set()
    out = []
    for c in sorted(cells, key=lambda c: (c.thinking is not None and not c.thinking, c.prompt_tokens,
                                           c.concurrency, CONTENT_TYPES.index(c.content))):
        if c.cell_id not in seen:
            seen.add(c.cell_id)
            out.append(c)
    return out
