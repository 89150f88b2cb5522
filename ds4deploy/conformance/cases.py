"""The conformance matrix: every case, the API it speaks and the modes it runs in, in the order the report lists
them. The cases live one module per API (`cases_openai`, `cases_anthropic`, `cases_auth`) plus the realistic
arguments (`arguments`) and the multi-turn replays (`replay`); what a case, a mode and a verdict are is in
`ds4deploy.conformance.common`.
"""

from __future__ import annotations

from ds4deploy.conformance import arguments, replay
from ds4deploy.conformance.cases_anthropic import (
    event_order_problems,
    messages_metadata,
    messages_recorded_shapes,
    messages_stream_events,
    messages_system,
    messages_system_in_messages,
    messages_text,
    messages_thinking,
    messages_tool_any,
    messages_tool_named,
    messages_tool_result,
)
from ds4deploy.conformance.cases_auth import auth_anthropic_header, auth_routes, exposure
from ds4deploy.conformance.cases_openai import (
    chat_basic,
    chat_finish_length,
    chat_finish_stop,
    chat_greedy,
    chat_guided_json,
    chat_include_usage,
    chat_n,
    chat_over_context,
    chat_seed,
    chat_stop_sequence,
    check_calls,
    reasoning_field,
    tools_auto,
    tools_named,
    tools_none,
    tools_parallel,
    tools_required_one,
    tools_required_several,
    tools_result_turn,
)
from ds4deploy.conformance.common import (
    ALL_MODES,
    FAIL,
    FINDING,
    MODEL,
    ONE,
    PASS,
    STREAM_MODES,
    THINK_MODES,
    VERDICTS,
    Case,
    Context,
    Mode,
    Outcome,
    collect,
)

__all__ = ["ALL_MODES", "CASES", "FAIL", "FINDING", "MODEL", "PASS", "VERDICTS", "Case", "Context", "Mode", "Outcome",
           "check_calls", "collect", "event_order_problems"]

CASES: list[Case] = [
    Case("chat.basic", "openai", ALL_MODES, chat_basic),
    Case("chat.include_usage", "http", [Mode(True, False)], chat_include_usage),
    Case("chat.finish_length", "openai", STREAM_MODES, chat_finish_length),
    Case("chat.finish_stop", "openai", ALL_MODES, chat_finish_stop),
    Case("chat.stop_sequence", "openai", ALL_MODES, chat_stop_sequence),
    Case("chat.n", "openai", STREAM_MODES, chat_n),
    Case("chat.seed", "openai", STREAM_MODES, chat_seed),
    Case("chat.greedy", "openai", THINK_MODES, chat_greedy),
    Case("chat.max_tokens_over_context", "http", STREAM_MODES, chat_over_context),
    Case("chat.guided_json", "openai", ALL_MODES, chat_guided_json),
    Case("tools.none", "openai", ALL_MODES, tools_none),
    Case("tools.auto", "openai", ALL_MODES, tools_auto),
    Case("tools.required_one", "openai", ALL_MODES, tools_required_one),
    Case("tools.required_several", "openai", ALL_MODES, tools_required_several),
    Case("tools.named", "openai", ALL_MODES, tools_named),
    Case("tools.parallel", "openai", ALL_MODES, tools_parallel),
    Case("tools.result_turn", "openai", ALL_MODES, tools_result_turn),
    Case("reasoning.field", "openai", ALL_MODES, reasoning_field),
    Case("messages.text", "anthropic", STREAM_MODES, messages_text),
    Case("messages.stream_events", "http", [Mode(True)], messages_stream_events),
    Case("messages.tool_named", "http", STREAM_MODES, messages_tool_named),
    Case("messages.tool_any", "http", STREAM_MODES, messages_tool_any),
    Case("messages.tool_result", "http", STREAM_MODES, messages_tool_result),
    Case("messages.system", "http", ONE, messages_system),
    Case("messages.system_in_messages", "http", ONE, messages_system_in_messages),
    Case("messages.metadata", "http", ONE, messages_metadata),
    Case("messages.thinking", "http", ONE, messages_thinking),
    Case("messages.recorded_shapes", "http", ONE, messages_recorded_shapes),
    Case("auth.generation_routes", "http", ONE, auth_routes),
    Case("auth.anthropic_header", "http", ONE, auth_anthropic_header),
    Case("exposure.keyless_routes", "http", ONE, exposure),
    *arguments.CASES,
    *replay.CASES,
]
