"""Client conformance: the matrix of real client requests an owner runs before pointing a coding agent at a server.

- `ds4deploy.conformance.cases`: the cases, each a function of (context, mode) returning a verdict with evidence.
- `ds4deploy.conformance.runner`: resolves the server (recipe or ``--url``), checks it can be tested at all, runs
  every case in every mode that applies and prints the table.
- `ds4deploy.conformance.report`: the JSON and markdown reports (docs/results/conformance/<recipe>/).
- `ds4deploy.conformance.record`: the recording proxy (`ds4deploy conformance record`) and the recorded request
  shapes the matrix replays.
"""
