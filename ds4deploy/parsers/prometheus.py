"""Prometheus text exposition, as an engine's ``GET /metrics`` serves it (vLLM and llama-server both do), read with
prometheus-client's own parser.

`sum_samples` sums each sample over its label sets (model name, engine index, finish reason, ...), so a
data-parallel server with several engines reads as one. Counters carry their ``_total`` suffix in the text format;
which names an engine serves is that engine's knowledge (``METRICS`` in `ds4deploy.engines.vllm` and
`ds4deploy.engines.llamacpp`), not this module's.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.parser import text_string_to_metric_families


def sum_samples(text: str, names: Iterable[str] | None = None) -> dict[str, float]:
    """Sample name -> its value summed over every label set, for the samples in `names` (all when None).

    Raises:
        ValueError: `text` is not Prometheus text exposition (prometheus-client's parser refuses it).
    """
    wanted = None if names is None else frozenset(names)
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if wanted is None or sample.name in wanted:
                sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    return sums
