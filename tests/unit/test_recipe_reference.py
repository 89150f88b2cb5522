"""docs/recipe-reference.md is generated from the schema, the argv builder's flag table and the preflight rules
(`ds4deploy recipe reference`), covers every field, and is checked fresh by `make lint` (`--check`)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from ds4deploy.core.errors import UserError
from ds4deploy.engines import vllm
from ds4deploy.plan import reference
from ds4deploy.recipe.load import all_recipes, load_recipe
from tests.unit.conftest import run_cli


def test_every_field_has_a_description():
    assert reference.missing_descriptions() == []


def test_a_field_without_a_description_is_named():
    class Part(BaseModel):
        size_gb: float = Field(description="GB")
        count: int = 1

    class Whole(BaseModel):
        part: Part
        items: list[Part] = Field(default_factory=list, description="parts")

    assert reference.missing_descriptions(Whole) == ["Whole.part (part)", "Part.count (part.count)",
                                                     "Part.count (items[].count)"]


def test_the_committed_reference_is_fresh_and_covers_every_field():
    text = reference.REFERENCE.read_text(encoding="utf-8")
    assert text == reference.reference_markdown()
    stacks, gateways = text.split("\n# Gateway recipes\n")
    rows = [line.split("|")[1].strip().strip("`") for line in stacks.splitlines() if line.startswith("| `")]
    assert rows == [f.path for f in reference.fields() if "." not in f.path] + [
        f.path for f in reference.fields() if "." in f.path or "[]" in f.path]
    gw_rows = [line.split("|")[1].strip().strip("`") for line in gateways.splitlines() if line.startswith("| `")]
    assert sorted(gw_rows) == sorted(f.path for f in reference.fields(reference.GatewayRecipe))
    # One field's whole row: type, bounds, default, description, the flag it becomes, the rules that read it.
    row = next(line for line in text.splitlines() if line.startswith("| `serving.max_model_len` |"))
    assert "| int | >= 16 | required |" in row and "`--max-model-len`" in row
    assert "`coding-agent-fit`" in row and "`output-cap`" in row and "`gb10-fixed-kv`" in row


@pytest.mark.tool
def test_check_refuses_a_stale_or_missing_reference(tmp_path):
    stale = tmp_path / "recipe-reference.md"
    with pytest.raises(UserError, match="is missing") as err:
        reference.write_or_check(True, stale)
    assert err.value.code == 1
    stale.write_text(reference.reference_markdown().replace("tokens per request", "tokens"))
    with pytest.raises(UserError, match="is stale") as err:
        reference.write_or_check(True, stale)
    assert err.value.code == 1 and "ds4deploy recipe reference" in err.value.fix
    assert reference.write_or_check(False, stale) == f"wrote {stale}"
    assert reference.write_or_check(True, stale) == f"{stale} is fresh"


@pytest.mark.tool
def test_the_cli_checks_the_committed_reference():
    p = run_cli("recipe", "reference", "--check")
    assert p.returncode == 0, p.stderr
    assert "is fresh" in p.stdout


def test_the_argv_builder_writes_its_flags_from_the_table(monkeypatch):
    """The builder reads FIELD_FLAGS (so the reference names the flag the render writes): a changed entry changes
    the argv; and every flag the builder derives is in the table (extra_args pass through by name)."""
    cpu = load_recipe("cpu")
    monkeypatch.setitem(vllm.FIELD_FLAGS, "serving.max_model_len", ("--max-model-len-renamed",))
    args = vllm.engine_args(cpu)
    assert args[args.index("--max-model-len-renamed") + 1] == str(cpu.serving.max_model_len)
    monkeypatch.undo()
    table = {f for flags in vllm.FIELD_FLAGS.values() for f in flags} | {"--data-parallel-size-local"}
    for r in all_recipes():
        passed = {f"--{n}" for n in r.serving.extra_args} | {f"--no-{n}" for n in r.serving.extra_args}
        derived = {a for a in vllm.engine_args(r) if a.startswith("--")} - passed
        assert derived <= table, (r.name, derived - table)


def test_the_environment_table_is_what_engine_env_writes():
    gx10 = load_recipe("gx10x2-ds4-flash-fp8")
    env = vllm.engine_env(gx10)
    assert env["NCCL_IB_HCA"] == ",".join(gx10.fabric.nccl_ib_hca)
    for key in vllm.FIELD_ENV["fabric.rails[].netdev"]:
        assert env[key] == gx10.fabric.rails[0].netdev


def test_tracing_records_the_fields_a_rule_reads():
    """Fields are recorded by dotted path, list items with [], and a recipe property by the fields behind it."""
    seen: set[str] = set()
    t = reference.Traced(load_recipe("gx10x2-ds4-flash-fp8"), "", seen)
    _ = t.engine_port, [rail.netdev for rail in t.fabric.rails]
    assert {"serving.front_door", "serving.front_door.engine_port", "fabric.rails[].netdev"} <= seen
    assert "serving.max_model_len" not in seen
    with pytest.raises(AttributeError):
        t.name = "other"
