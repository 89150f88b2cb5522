"""Comparison of measured cells with the recipes' expected figures (within / above / below, with the source)."""

from __future__ import annotations

from ds4deploy.bench.expected import compare
from ds4deploy.recipe.load import load_recipe


def cell(prompt, conc, content="chat", valid=True, **metrics):
    base = {"decode_tok_s": None, "aggregate_tok_s": None, "per_session_tok_s": None, "prefill_tok_s": None,
            "ttft_s": None}
    base.update(metrics)
    return {"cell_id": f"p{prompt}-c{conc}-{content}", "spec": {"prompt_tokens": prompt, "concurrency": conc,
            "content": content, "thinking": None}, "valid": valid, **base}


def test_gx10_table_within_above_below():
    exp = load_recipe("gx10x2-ds4-flash-fp8").expected
    cells = [cell(256, 1, per_session_tok_s=56.0, ttft_s=0.30), cell(256, 6, aggregate_tok_s=100.0)]
    v = {(x.what, x.metric): x for x in compare(cells, "gx10-context", exp)}
    assert v[("256 x 1", "per_session_tok_s")].verdict == "within"  # 56.1 +- 10 %
    assert v[("256 x 1", "ttft_s")].verdict == "above"  # 0.30 > 0.21 x 1.1
    assert v[("256 x 6", "aggregate_tok_s")].verdict == "below"  # 100 < 139.3 x 0.9
    assert v[("8192 x 1", "prefill_tok_s")].verdict == "no data"
    assert all("docs/sources.md#gx10-context-table" in x.source for x in v.values())


def test_other_profiles_entries_are_not_compared():
    exp = load_recipe("gx10x2-ds4-flash-fp8").expected
    assert compare([cell(256, 1, per_session_tok_s=56.0)], "smoke", exp) == []


def test_entry_without_content_uses_the_median_over_content_types():
    exp = load_recipe("v100x8-ds41-flash-iq2").expected
    cells = [cell(1024, 1, c, ttft_s=t, decode_tok_s=d) for c, t, d in
             (("code", 1.0, 215.0), ("json", 1.2, 150.0), ("legal", 5.0, 118.0))]
    v = {(x.what, x.metric): x for x in compare(cells, "v100-content", exp)}
    assert v[("1024 x 1", "ttft_s")].measured == 1.2 and v[("1024 x 1", "ttft_s")].verdict == "within"
    assert v[("1024 x 1 code", "decode_tok_s")].verdict == "within"
    assert v[("1024 x 1 json", "decode_tok_s")].verdict == "below"


def test_recipe_ranges_apply_to_single_session_cells_and_carry_invalid_flag():
    exp = load_recipe("cpu").expected  # decode and TTFT ranges from the recipe
    above = exp.decode_tok_s.high * 1.25
    cells = [cell(256, 1, decode_tok_s=above, ttft_s=exp.ttft_s.low * 2, valid=False), cell(256, 4, decode_tok_s=5.0)]
    v = compare(cells, "smoke", exp)
    assert [(x.metric, x.verdict, x.invalid) for x in v] == [("decode_tok_s", "above", True),
                                                             ("ttft_s", "within", True)]
