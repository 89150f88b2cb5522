"""Facts docs/coding-agents.md states about what runs, checked against their one source: the cpu recipe's context (the
rendered engine runs `--max-model-len` from it, tests/unit/test_render_contract.py), the auto-compact window each
coding-agent recipe tells Claude Code users to set, and the client entries for Codex CLI and `llm` (the `llm` entry
is the one tests/support/real_clients.py writes for the real client in the infra tier)."""

from __future__ import annotations

import re
import tomllib

import yaml

from ds4deploy.recipe.load import load_recipe
from ds4deploy.recipe.schema import CLIENT_COMPACT_WINDOW_TOKENS
from tests.unit.conftest import REPO

README = (REPO / "docs" / "coding-agents.md").read_text()  # where the README sends agent users


def _block(lang: str, needle: str) -> str:
    blocks = [b for b in re.findall(rf"```{lang}\n(.*?)```", README, re.S) if needle in b]
    assert len(blocks) == 1, f"one ```{lang} block with {needle!r} in docs/coding-agents.md"
    return re.sub(r"^ {2}", "", blocks[0], flags=re.M)


def test_the_cpu_context_the_readme_states_is_the_one_deployed():
    ctx = load_recipe("cpu").serving.max_model_len
    said = re.findall(r"`cpu` \(([\d,]+) tokens\)", README)
    assert said == [f"{ctx:,}"], said
    window = re.search(r"longer sessions on it use\s+`CLAUDE_CODE_AUTO_COMPACT_WINDOW=(\d+)` \(([\d,]+) - ([\d,]+)\)",
                       README)
    assert window, "the README names the window that fits the cpu context"
    output = load_recipe("v100x8-ds41-flash-iq2").serving.coding_agent.output_tokens  # Claude Code's max_tokens
    assert int(window[1]) == ctx - output and window[2] == f"{ctx:,}" and window[3] == f"{output:,}"
    assert "2,048 tokens" not in README and "2048 tokens" not in (REPO / "recipes" / "cpu.yaml").read_text()


def test_the_window_the_readme_gives_each_coding_agent_recipe_is_the_recipes():
    for name in ("v100x8-ds41-flash-iq2", "gx10x2-ds4-flash-fp8"):
        r = load_recipe(name)
        a = r.serving.coding_agent
        m = re.search(rf"`{name}`: (\d+|none needed[^)]+)", README)
        assert m, name
        if a.compact_window_tokens is None:
            assert m[1].startswith("none needed") and f"{r.serving.max_model_len:,}" in m[1]
            assert CLIENT_COMPACT_WINDOW_TOKENS + a.output_tokens <= r.serving.max_model_len
        else:
            assert m[1] == str(a.compact_window_tokens)
    assert f"assumes {CLIENT_COMPACT_WINDOW_TOKENS:,} tokens" in README


def test_codex_gets_a_provider_entry_speaking_the_responses_api():
    conf = tomllib.loads(_block("toml", "model_providers"))
    provider = conf["model_providers"][conf["model_provider"]]
    assert provider["base_url"].endswith("/v1") and provider["wire_api"] == "responses"
    assert re.fullmatch(r"[A-Z][A-Z0-9_]+", provider["env_key"]) and f"export {provider['env_key']}=$KEY" in README
    assert conf["model"] == load_recipe("cpu").model.served_name
    assert "Codex CLI ignores `OPENAI_BASE_URL`" in README


def test_llm_gets_its_key_by_name():
    entry = yaml.safe_load(_block("yaml", "api_key_name"))[0]
    written = (REPO / "tests" / "support" / "real_clients.py").read_text()
    for key in entry:
        assert f"{key}:" in written, f"the real-client test writes no {key}"
    assert f"llm keys set {entry['api_key_name']}" in README
