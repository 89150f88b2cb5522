"""`ds4deploy summary` (the last lines of `make deploy`): where a deployed recipe answers, never its key."""

from __future__ import annotations

import pytest
import yaml

from ds4deploy.operate.summary import summary


def test_without_an_inventory_this_host_is_shown():
    text = summary("cpu-llamacpp--lan")  # 0.0.0.0 includes this host's loopback (ds4deploy.core.net.base_url)
    assert "OpenAI API:     http://127.0.0.1:8020/v1" in text and "replicas:" not in text


@pytest.mark.tool
def test_a_network_recipe_is_shown_at_its_hosts_addresses(tmp_path):
    """ansible-inventory reads the inventory: one host -> its address; two hosts of a one-node recipe -> both
    replicas listed, the first as the API, each with its own key on its host; a local host -> 127.0.0.1."""
    inv = tmp_path / "office.yml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"box-a": {"ansible_host": "10.0.0.11"},
                                                     "box-b": {"ansible_host": "10.0.0.12"}}}}))
    text = summary("cpu-llamacpp--lan", inv)
    assert "OpenAI API:     http://10.0.0.11:8020/v1" in text
    assert ("replicas:       http://10.0.0.11:8020, http://10.0.0.12:8020 (one per host, each with its own key in "
            "/etc/ds4deploy/secrets/cpu-llamacpp.env on that host") in text
    assert "VLLM_API_KEY=ds4-" not in text
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"localhost": {"ansible_connection": "local"}}}}))
    text = summary("cpu-llamacpp--lan", inv)
    assert "http://127.0.0.1:8020/v1" in text and "replicas:" not in text
