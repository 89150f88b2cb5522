"""Client conformance: the matrix of real client requests an owner runs before pointing a coding agent at a server.

- `ds4deploy.conformance.common`: verdicts, modes, the server context and its clients, collecting an answer.
- `ds4deploy.conformance.cases_openai`, `cases_anthropic`, `cases_auth`: the cases, one module per API.
- `ds4deploy.conformance.arguments`: realistic tool-call arguments forced by their own schema, and the byte-exact
  checks (first differing byte).
- `ds4deploy.conformance.replay`: multi-turn conversations replayed as agents send them.
- `ds4deploy.conformance.cases`: the matrix (every case, its API and modes, in report order).
- `ds4deploy.conformance.runner`: resolves the server (recipe or ``--url``), checks it can be tested at all, runs
  every case in every mode that applies and prints the table.
- `ds4deploy.conformance.report`: the JSON and markdown reports (docs/results/conformance/<recipe>/), counts per mode.
- `ds4deploy.conformance.record`: the recording proxy (`ds4deploy conformance record`) and the recorded request
  shapes the matrix replays.
- `ds4deploy.conformance.pinned_parsers` (+ `parser_probe`, run inside the engine venv): the pinned engines' own
  DeepSeek V4 parsers run offline (`ds4deploy conformance parsers`, docs/results/conformance/parsers.md).
"""
