"""The serving surface: output caps, the coding-agent fit and the front door's ports."""

from __future__ import annotations

from ds4deploy.plan.preflight.rulebook import rule
from ds4deploy.recipe.schema import Recipe

# A context above this many tokens needs a server-side output cap: one uncapped request there decodes for 20-55 min
# at the reference systems' 10-30 tok/s single-session decode (docs/sources.md#v100x8, #gx10-pair), and one ran
# 2 h 45 min (docs/sources.md#gx10-benchmark-method).
LONG_CONTEXT_TOKENS = 32768


@rule("output-cap", "a long-context recipe caps the output of requests that set no max_tokens",
      "docs/sources.md#gx10-benchmark-method: one request without max_tokens generated for 2 h 45 min; "
      "vLLM --override-generation-config "
      "max_new_tokens sets the default (vLLM docs, engine arguments)",
      lambda r: True)
def _output_cap(r: Recipe, hosts):
    cap, ctx = r.serving.default_max_tokens, r.serving.max_model_len
    if cap is None:
        nums = f"serving.default_max_tokens unset; max_model_len {ctx}"
        if ctx > LONG_CONTEXT_TOKENS:
            return "fail", nums + f" > {LONG_CONTEXT_TOKENS}", (
                "set serving.default_max_tokens (e.g. 32768 for a coding agent): a request without max_tokens "
                "otherwise decodes to the end of the context")
        return "pass", nums + f" <= {LONG_CONTEXT_TOKENS} (short enough uncapped)", ""
    nums = f"default_max_tokens {cap}; max_model_len {ctx}"
    if cap >= ctx:
        return "fail", nums, f"set serving.default_max_tokens below max_model_len ({ctx}) to leave room for a prompt"
    return "pass", nums, ""


@rule("coding-agent-fit", "a coding-agent recipe holds the agent's prompt, as long as the agent lets it grow before "
      "it compacts, plus its output budget, and parses reasoning when the agent asks for thinking",
      "Claude Code sends max_tokens 32000 and a thinking block and compacts only near its auto-compact window "
      "(CLAUDE_CODE_AUTO_COMPACT_WINDOW; unset, 1M tokens for a model it does not know); vLLM answers 400 when "
      "prompt + max_tokens exceed max_model_len (anthropics/claude-code#62070), caps max_tokens at "
      "--override-generation-config max_new_tokens, and a thinking request needs --reasoning-parser "
      "(docs/sources.md#coding-agent-compaction; README, pointing a coding agent at a deployment)",
      lambda r: r.serving.coding_agent is not None)
def _coding_agent(r: Recipe, hosts):
    a, ctx = r.serving.coding_agent, r.serving.max_model_len
    window = a.window
    set_by = "coding_agent.compact_window_tokens" if a.compact_window_tokens else "the client's default"
    need = window + a.output_tokens
    fits = ctx - a.output_tokens
    nums = (f"auto-compact window {window} ({set_by}) + output {a.output_tokens} = {need} tokens; max_model_len "
            f"{ctx}; first prompt {a.prompt_tokens}")
    if a.prompt_tokens >= fits:
        return "fail", nums, (f"raise serving.max_model_len to more than {a.prompt_tokens + a.output_tokens} (the "
                              "agent's first prompt plus its output budget), or lower coding_agent.output_tokens "
                              "(the agent's max_tokens setting, e.g. CLAUDE_CODE_MAX_OUTPUT_TOKENS)")
    if need > ctx:
        return "fail", nums, (
            f"set coding_agent.compact_window_tokens to at most {fits} (max_model_len - output) and tell clients to "
            f"use it (Claude Code: CLAUDE_CODE_AUTO_COMPACT_WINDOW={fits}; README), or raise serving.max_model_len "
            f"to at least {need}: otherwise every request fails with 400 once a session's prompt passes {fits} tokens")
    if window <= a.prompt_tokens:
        return "fail", nums, (f"raise coding_agent.compact_window_tokens above the first prompt ({a.prompt_tokens} "
                              "tokens): the agent would compact on every turn")
    cap = r.serving.default_max_tokens
    if cap is not None and cap < a.output_tokens:
        return "fail", nums + f"; server output cap {cap}", (
            f"raise serving.default_max_tokens to at least {a.output_tokens}: vLLM caps every request's max_tokens "
            "there, so the agent's answers would be cut short")
    if a.thinking and not r.serving.reasoning_parser:
        return "fail", nums + "; thinking requested, no reasoning_parser", (
            "set serving.reasoning_parser to the model's parser (e.g. deepseek_v4), or coding_agent.thinking: false")
    return "pass", nums + ("; reasoning parser " + r.serving.reasoning_parser if a.thinking else ""), ""


@rule("front-door-ports", "front door and engine do not share a port",
      "host networking puts proxy and engine in one network namespace: two listeners on one port cannot both bind",
      lambda r: r.serving.front_door is not None)
def _front_door_ports(r: Recipe, hosts):
    port, eng = r.serving.port, r.engine_port
    engine_host = "127.0.0.1" if r.serving.network_mode == "host" else "engine"
    nums = f"front door {r.serving.bind_address}:{port}, engine {engine_host}:{eng}"
    if r.serving.network_mode == "bridge":
        return "pass", nums + " (own network namespaces)", ""
    taken = {port: "serving.port", r.master_port: "the rendezvous port"} if r.master_port else {port: "serving.port"}
    if r.serving.front_door.engine_port is None or eng in taken:
        what = taken.get(eng, "serving.port")
        return "fail", nums + f": the engine would take {what}", (
            f"set serving.front_door.engine_port to a free port other than {', '.join(map(str, taken))} "
            f"(e.g. {port + 1}) and run `ds4deploy render`")
    return "pass", nums, ""
