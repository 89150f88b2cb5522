"""Profiles as data: every bundled profile validates; cells follow the recipe's limits; too-long cells are refused."""

from __future__ import annotations

import pytest

from ds4deploy.bench.profiles import Profile, Span, expand, load_profile, profile_names
from ds4deploy.core.errors import UserError
from ds4deploy.recipe.load import load_recipe

# Which recipe each reference profile was written for (its expected.table names the profile).
HOME = {"smoke": "cpu", "context-sweep": "cpu", "v100-content": "v100x8-ds41-flash-iq2",
        "gx10-context": "gx10x2-ds4-flash-fp8", "gx10-many-users": "gx10x2-ds4-flash-fp8",
        "single-stream": "rtx3090x2-xeon-ds4-flash", "clock-sweep": "gx10x2-ds4-flash-fp8"}


def test_every_bundled_profile_expands_for_its_recipe():
    assert set(profile_names()) == set(HOME)
    for name, recipe in HOME.items():
        cells = expand(load_profile(name), load_recipe(recipe))
        assert cells, name
        assert len({c.cell_id for c in cells}) == len(cells)


def test_expected_tables_name_existing_profiles_and_cells():
    for recipe in set(HOME.values()):
        r = load_recipe(recipe)
        for e in r.expected.table:
            cells = expand(load_profile(e.profile), r)
            assert any(c.prompt_tokens == e.prompt_tokens and c.concurrency == e.concurrency
                       and (e.content is None or c.content == e.content) for c in cells), (recipe, e)


def test_gx10_profile_is_the_seeds_b_cells():
    cells = expand(load_profile("gx10-context"), load_recipe("gx10x2-ds4-flash-fp8"))
    assert [(c.prompt_tokens, c.concurrency) for c in cells] == [
        (256, 1), (256, 6), (2048, 1), (8192, 1), (32768, 1), (32768, 6), (131072, 1), (131072, 4), (262144, 1),
        (524288, 1)]


def test_context_sweep_follows_the_recipe_limits():
    r = load_recipe("cpu")
    cells = expand(load_profile("context-sweep"), r)
    prompts = sorted({c.prompt_tokens for c in cells})
    # powers of two from 256, up to max_model_len - 256 max_tokens
    assert prompts[:3] == [256, 512, 1024] and prompts[-1] == r.serving.max_model_len - 256
    assert sorted({c.concurrency for c in cells}) == [1, 2, 4]


def test_profile_longer_than_the_recipe_is_refused_naming_the_cell():
    with pytest.raises(UserError) as exc:
        expand(load_profile("gx10-context"), load_recipe("cpu"))
    limit = load_recipe("cpu").serving.max_model_len
    assert "p524288-c1-chat" in exc.value.cause and f"max_model_len {limit}" in exc.value.cause
    assert "context-sweep" in exc.value.fix


def test_span_values():
    assert Span.model_validate({"from": 256, "to": "max"}).values(1000) == [256, 512, 1000]
    assert Span.model_validate({"from": 1, "to": 8}).values(4) == [1, 2, 4, 8]
    assert Span.model_validate({"from": 256, "to": "max"}).values(100) == []


def test_profile_needs_exactly_one_of_grid_and_cells():
    with pytest.raises(ValueError, match="exactly one"):
        Profile.model_validate({"name": "x", "description": "d", "source": "src"})


def test_unknown_profile_lists_the_bundled_ones():
    with pytest.raises(UserError, match="no benchmark profile named 'nope'") as exc:
        load_profile("nope")
    assert "smoke" in exc.value.fix


def test_a_profile_with_a_key_written_twice_is_refused(tmp_path):
    from ds4deploy.bench.profiles import load_profile
    from ds4deploy.core.errors import UserError

    p = tmp_path / "dup.yaml"
    p.write_text("name: dup\nconcurrency: [1]\nconcurrency: [4]\n")
    with pytest.raises(UserError, match="key 'concurrency' is written twice, at lines 2 and 3"):
        load_profile(str(p))
