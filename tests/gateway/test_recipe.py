"""Gateway recipes without Docker: the schema, the checks against the recipes they name, the people key file and
the committed render, each bad input through the real `ds4deploy` command (one message with cause and fix, exit 2,
nothing written)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ds4deploy.render import gateway
from tests.support.gateway_door import local_door_conf
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
OFFICE = REPO / "recipes" / "gateways" / "office.yaml"
KEY_A = "ds4p-" + "a" * 40
KEY_B = "ds4p-" + "b" * 40


def cli(*args: str, compose_dir: Path | None = None) -> subprocess.CompletedProcess:
    """`ds4deploy <args>` in a subprocess, as a user runs it; renders go to `compose_dir` when given
    ($DS4_COMPOSE_DIR), so a render the code wrongly accepts never lands in the committed compose/."""
    env = {**os.environ, **({"DS4_COMPOSE_DIR": str(compose_dir)} if compose_dir else {})}
    return subprocess.run([sys.executable, "-m", "ds4deploy.cli", *args], capture_output=True, text=True,
                          cwd=REPO, check=False, env=env)


def render_refused(path: Path, *words: str) -> None:
    """`ds4deploy gateway render <path>` refuses (see `refused`) and writes nothing."""
    out = path.parent / "compose-out"
    refused(cli("gateway", "render", str(path), compose_dir=out), *words)
    assert not out.exists(), sorted(out.rglob("*"))


def office(tmp_path: Path, **changes) -> Path:
    """A copy of the office gateway recipe with `changes` applied at the top level, as ``<tmp>/office.yaml``."""
    data = yaml.safe_load(OFFICE.read_text())
    data.update(changes)
    path = tmp_path / "office.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def refused(p: subprocess.CompletedProcess, *words: str) -> None:
    """Exit 2, one 'error:' and one 'fix:' line pair, no traceback, every word in the message."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and p.stderr.startswith("error: "), p.stderr
    assert "\nfix: " in p.stderr, p.stderr
    for w in words:
        assert w in p.stderr, (w, p.stderr)


def test_office_loads_and_resolves_both_backends() -> None:
    gw = gateway.load_gateway("office")
    backends = gateway.resolve_backends(gw)
    # Each URL is the host the recipe names at the port its backend's recipe serves on (cpu--lan: 8000).
    assert [b.url for b in backends] == ["http://box-a.office.lan:8000", "http://box-b.office.lan:8000"]
    assert backends[0].identity == backends[1].identity
    assert backends[0].models[0] == "ds4-tiny"


def test_committed_render_is_fresh_and_holds_no_key() -> None:
    p = cli("gateway", "render", "--check")
    assert p.returncode == 0, p.stderr
    assert "docker compose accepts them" in p.stdout
    text = "".join(f.read_text() for f in (REPO / "compose" / "gateways" / "office").iterdir())
    assert "ds4p-" not in text and "VLLM_API_KEY=" not in text
    argv = json.loads((REPO / "compose" / "gateways" / "office" / "router-args.json").read_text())
    assert "--api-key" not in argv
    assert argv[argv.index("--policy") + 1] == "least_load"
    assert argv[argv.index("--routing-key-headers") + 1] == "x-claude-code-session-id"


def test_render_check_fails_on_a_hand_edit(tmp_path: Path) -> None:
    gw = gateway.load_gateway("office")
    files = gateway.render(gw)
    gateway.write([(gw, files)], tmp_path)
    assert gateway.stale(gw, files, tmp_path) == []
    conf = tmp_path / "office" / "front-door.conf.template"
    conf.write_text(conf.read_text().replace("return 401;", "return 200;", 1))
    assert gateway.stale(gw, files, tmp_path) == [f"{conf} is stale"]


def test_unknown_backend_recipe_is_refused(tmp_path: Path) -> None:
    path = office(tmp_path, backends=[{"name": "a", "recipe": "no-such-recipe", "host": "a"},
                                      {"name": "b", "recipe": "cpu-llamacpp--lan", "host": "b"}])
    render_refused(path, "backend 'a' names recipe 'no-such-recipe', which does not exist")


def test_one_name_two_models_is_refused(tmp_path: Path) -> None:
    # cpu (a Qwen3-layout safetensors checkpoint) and cpu-llamacpp (a deepseek4 GGUF) both answer to ds4-tiny.
    # Both listen on loopback only: the gateway's own host (their ports differ: 8000, 8020).
    path = office(tmp_path, backends=[{"name": "vllm", "recipe": "cpu", "host": "127.0.0.1"},
                                      {"name": "gguf", "recipe": "cpu-llamacpp", "host": "localhost"}])
    render_refused(path,
                   "model name 'ds4-tiny' is served by backends with different models: vllm (", "gguf (")


def test_a_loopback_recipe_on_another_host_is_refused(tmp_path: Path) -> None:
    """cpu-llamacpp listens on 127.0.0.1 only: on box-a the gateway could never reach it (every request a refused
    connection). On the gateway's own host (127.0.0.1) it is reachable; its lan variant is reachable anywhere."""
    path = office(tmp_path, backends=[{"name": "box-a", "recipe": "cpu-llamacpp", "host": "box-a.office.lan"},
                                      {"name": "box-b", "recipe": "cpu-llamacpp--lan", "host": "box-b.office.lan"}])
    render_refused(path, "backend 'box-a': recipe 'cpu-llamacpp' listens on 127.0.0.1 only",
                   "cannot reach it at box-a.office.lan", "cpu-llamacpp--lan")
    p = cli("gateway", "render", str(path), compose_dir=tmp_path / "out")
    assert "box-b" not in p.stderr, p.stderr
    path = office(tmp_path, backends=[{"name": "here", "recipe": "cpu-llamacpp", "host": "127.0.0.1"},
                                      {"name": "box-b", "recipe": "cpu-llamacpp--lan", "host": "box-b.office.lan"}])
    gw = gateway.load_gateway(str(path))
    backends = gateway.resolve_backends(gw)
    assert [b.url for b in backends] == ["http://127.0.0.1:8020", "http://box-b.office.lan:8020"]
    # A variant is the base recipe's model: one identity, so the two may serve one name.
    assert backends[0].identity == backends[1].identity


def test_an_unknown_variant_is_refused(tmp_path: Path) -> None:
    path = office(tmp_path, backends=[{"name": "a", "recipe": "cpu-llamacpp--wan", "host": "a"},
                                      {"name": "b", "recipe": "cpu-llamacpp--lan", "host": "b"}])
    render_refused(path, "backend 'a':", "wan")


def test_a_url_backend_with_the_same_model_id_is_accepted(tmp_path: Path) -> None:
    ident = cli("gateway", "model-id", "cpu-llamacpp").stdout.strip()
    path = office(tmp_path, backends=[{"name": "a", "recipe": "cpu-llamacpp--lan", "host": "a"},
                                      {"name": "b", "url": "http://10.0.0.9:8000", "models": ["ds4-tiny"],
                                       "manifest_sha256": ident}])
    gw = gateway.load_gateway(path)
    assert [b.identity for b in gateway.resolve_backends(gw)] == [ident, ident]


def test_a_url_backend_with_another_manifest_is_refused(tmp_path: Path) -> None:
    path = office(tmp_path, backends=[{"name": "a", "recipe": "cpu-llamacpp--lan", "host": "a"},
                                      {"name": "b", "url": "http://10.0.0.9:8000", "models": ["ds4-tiny"],
                                       "manifest_sha256": "0" * 64}])
    render_refused(path, "different models")


def test_schema_errors_name_the_key_and_line(tmp_path: Path) -> None:
    path = office(tmp_path, backends=[{"name": "a", "recipe": "cpu-llamacpp"}])
    render_refused(path, "backends[0]", "a recipe backend needs host", "(line ")
    render_refused(office(tmp_path, port=8031), "must differ")
    render_refused(office(tmp_path, people=[{"name": "al"}, {"name": "al"}]), "person al listed twice")


def test_a_key_in_the_recipe_is_refused(tmp_path: Path) -> None:
    path = office(tmp_path, description="key sk-" + "x" * 40)
    render_refused(path, "holds credentials")


def people_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "people"
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_people_keys_become_maps_and_no_key_is_printed(tmp_path: Path) -> None:
    path = people_file(tmp_path, f"# office\nalice {KEY_A}\nbob {KEY_B}\n")
    p = cli("gateway", "keys", "office", "--people-file", str(path), "--dest", str(tmp_path / "maps"))
    assert p.returncode == 0, p.stderr
    assert "2 person(s)" in p.stdout and "no key (refused at the door): carol" in p.stdout
    assert KEY_A not in p.stdout + p.stderr
    bearer = (tmp_path / "maps" / "bearer.map").read_text()
    assert f'"~^[Bb][Ee][Aa][Rr][Ee][Rr] +{KEY_A}$" alice;' in bearer
    assert (tmp_path / "maps" / "x-api-key.map").read_text().count("\n") == 2
    assert oct((tmp_path / "maps" / "bearer.map").stat().st_mode & 0o777) == "0o600"


def test_one_key_for_two_people_is_refused(tmp_path: Path) -> None:
    path = people_file(tmp_path, f"alice {KEY_A}\nbob {KEY_A}\n")
    p = cli("gateway", "keys", "office", "--people-file", str(path), "--dest", str(tmp_path / "maps"))
    refused(p, "line 2 gives 'bob' the key of 'alice' (line 1)")
    assert KEY_A not in p.stderr
    assert not (tmp_path / "maps").exists()


@pytest.mark.parametrize(("text", "mode", "words"), [
    (f"alice {KEY_A}\n", 0o644, ("readable or writable by group or others", "chmod 600")),
    (f"mallory {KEY_A}\n", 0o600, ("line 1 names a person who is not in the recipe's people (alice, bob, carol)",)),
    ("alice short-key\n", 0o600, ("not 32 to 1024 characters",)),
    (f"alice {KEY_A} extra\n", 0o600, ("line 1 is not '<person> <key>'",)),
])
def test_bad_people_files_are_refused(tmp_path: Path, text: str, mode: int, words: tuple[str, ...]) -> None:
    path = people_file(tmp_path, text, mode)
    refused(cli("gateway", "keys", "office", "--people-file", str(path), "--dest", str(tmp_path / "maps")), *words)
    assert not (tmp_path / "maps").exists()


def test_a_line_written_key_first_is_refused_without_quoting_the_key(tmp_path: Path) -> None:
    path = people_file(tmp_path, f"{KEY_B} alice\n")
    p = cli("gateway", "keys", "office", "--people-file", str(path), "--dest", str(tmp_path / "maps"))
    refused(p, "line 1: its first field looks like a key")
    assert KEY_B not in p.stderr and "ds4p-" not in p.stderr
    # A key too short to look like one, the wrong way round: refused as an unknown person, still not quoted.
    path = people_file(tmp_path, "s3cret-but-short alice\n")
    p = cli("gateway", "keys", "office", "--people-file", str(path), "--dest", str(tmp_path / "maps"))
    refused(p, "line 1 names a person who is not in the recipe's people")
    assert "s3cret" not in p.stderr


def test_an_unreadable_people_file_and_log_are_one_message(tmp_path: Path) -> None:
    path = people_file(tmp_path, f"alice {KEY_A}\n")
    path.write_bytes(b"alice \xff\xfe\n")
    refused(cli("gateway", "keys", "office", "--people-file", str(path), "--dest", str(tmp_path / "maps")),
            f"cannot read the people key file {path}")
    refused(cli("gateway", "usage", "office", "--log", str(tmp_path / "no-such.log")), "cannot read the access log")


def test_an_ipv6_bind_address_is_refused(tmp_path: Path) -> None:
    render_refused(office(tmp_path, bind_address="::1"), "bind_address")


@pytest.mark.parametrize("name", ["office", "loopback"])  # loopback: with fallback pairs (fallback.js loaded)
def test_nginx_accepts_the_front_door_config(tmp_path: Path, name: str) -> None:
    """nginx's own parser on the rendered config with real maps (the host's nginx, as the stacks' render check)."""
    from ds4deploy.render.front_door import nginx_binary

    nginx = nginx_binary()
    if nginx is None:
        pytest.skip("nginx is not installed here")
    conf = local_door_conf(gateway.load_gateway(name), {"alice": KEY_A}, tmp_path, f"unix:{tmp_path}/s.sock")
    p = subprocess.run([nginx, "-t", "-q", "-e", str(tmp_path / "e.log"), "-p", f"{tmp_path}/", "-c", str(conf)],
                       capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr


NGINX_OFFICE = REPO / "recipes" / "gateways" / "office-nginx.yaml"


def office_nginx(tmp_path: Path, routing: dict | None = None, **changes) -> Path:
    """A copy of the office-nginx gateway recipe with `changes` at the top level and `routing` merged into its
    routing, as ``<tmp>/office-nginx.yaml``."""
    data = yaml.safe_load(NGINX_OFFICE.read_text())
    data.update(changes)
    data["routing"].update(routing or {})
    path = tmp_path / "office-nginx.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_nginx_router_renders_the_front_door_alone() -> None:
    gw = gateway.load_gateway("office-nginx")
    files = gateway.render(gw)
    assert sorted(files) == ["compose.yaml", "front-door.conf.template"]
    compose = yaml.safe_load(files["compose.yaml"])
    assert list(compose["services"]) == ["front-door"] and "depends_on" not in compose["services"]["front-door"]
    conf = files["front-door.conf.template"]
    assert "hash $ds4_route_key consistent;" in conf
    # the session header, else the person (an empty key would fall back to round robin)
    assert re.search(r'map \$http_x_claude_code_session_id \$ds4_route_key \{\s*"" "person:\$ds4_person";\s*'
                     r'default \$http_x_claude_code_session_id;', conf), conf
    assert "server box-a.office.lan:8020 max_fails=1 fail_timeout=10s;" in conf
    # A POST is passed on only when it was never sent (no non_idempotent): no generation runs twice.
    assert "        proxy_next_upstream error timeout;\n" in conf
    assert 'proxy_set_header Authorization "Bearer ${VLLM_API_KEY}";' in conf and "proxy_buffering off;" in conf


def test_the_nginx_router_serves_one_model_name(tmp_path: Path) -> None:
    render_refused(office_nginx(tmp_path, models=["ds4-tiny", "other"]),
                   "routing.router nginx serves one model name, and models lists 2 (ds4-tiny, other)",
                   "routing.router: smg")
    ident = cli("gateway", "model-id", "cpu-llamacpp").stdout.strip()
    path = office_nginx(tmp_path, backends=[{"name": "a", "recipe": "cpu-llamacpp--lan", "host": "a"},
                                            {"name": "c", "url": "http://10.0.0.9:8000", "models": ["other"],
                                             "manifest_sha256": ident}])
    render_refused(path, "backend 'c' does not serve 'ds4-tiny'")


def test_a_fallback_the_door_cannot_apply_is_refused(tmp_path: Path) -> None:
    """`fallback:` pairs the door resends once (docs/gateway.md, "Fallback model"): a pair naming a model outside
    `models` or the model itself, and a chain (a fallback with a fallback of its own: the second hop would never run),
    are refused with the cause, nothing written. The committed loopback recipe's pair renders (its nginx -t and the
    fresh-render check are below and in `make lint`)."""
    render_refused(office(tmp_path, fallback={"ds4-tiny": "other"}), "fallback ds4-tiny -> other",
                   "other names listed in models")
    render_refused(office(tmp_path, fallback={"ds4-tiny": "ds4-tiny"}), "fallback ds4-tiny -> ds4-tiny")
    render_refused(office(tmp_path, models=["ds4-tiny", "b", "c"], fallback={"ds4-tiny": "b", "b": "c"}),
                   "fallback ds4-tiny -> b -> c: one hop only", "name the last model for ds4-tiny directly")
    assert gateway.load_gateway("loopback").fallback == {"office-other": "office-tiny"}


def test_a_gateway_named_like_a_stack_recipe_is_refused(tmp_path: Path) -> None:
    """`make deploy RECIPE=<name>` takes the gateway when recipes/gateways/<name>.yaml exists: a gateway named like a
    stack recipe would hide that stack from make deploy/status/down."""
    data = yaml.safe_load(OFFICE.read_text())
    data["name"] = "cpu"
    path = tmp_path / "cpu.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    render_refused(path, "gateway name 'cpu' is also the name of the stack recipe", "a name of its own")


def test_router_settings_belong_to_their_router(tmp_path: Path) -> None:
    render_refused(office_nginx(tmp_path, router_port=8035), "router nginx has no router process")
    render_refused(office_nginx(tmp_path, routing={"policy": "least_load"}), "policy set SMG's routing")
    render_refused(office(tmp_path, router_port=None), "router smg needs router_port and router_metrics_port")


def test_nginx_accepts_the_nginx_router_config(tmp_path: Path) -> None:
    """nginx's own parser on the office-nginx render (its backend host names moved to loopback: nginx resolves
    upstream names when it loads the config, and box-a.office.lan resolves only in that office)."""
    from ds4deploy.render.front_door import nginx_binary

    nginx = nginx_binary()
    if nginx is None:
        pytest.skip("nginx is not installed here")
    conf = local_door_conf(gateway.load_gateway("office-nginx"), {"alice": KEY_A}, tmp_path,
                           f"unix:{tmp_path}/s.sock", (("server box-a.office.lan:", "server 127.0.0.1:"),
                                                       ("server box-b.office.lan:", "server 127.0.0.2:")))
    assert "office.lan" not in conf.read_text() and "unix:" in conf.read_text()
    p = subprocess.run([nginx, "-t", "-q", "-e", str(tmp_path / "e.log"), "-p", f"{tmp_path}/", "-c", str(conf)],
                       capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr



def test_drain_and_rejoin_refuse_bad_input_before_anything_changes(tmp_path: Path) -> None:
    """An unknown backend, a missing or open key file and a gateway that is not running: one message each, exit 2,
    no key printed. (Draining and rejoining a running gateway: tests/gateway/test_deployed.py.)"""
    key = "ds4-" + "k" * 40
    key_file = tmp_path / "gateway.env"
    port = free_port()
    path = office(tmp_path, key_file=str(key_file), router_port=port)
    for verb in ("drain", "rejoin"):
        refused(cli("gateway", verb, str(path), "box-c"), "gateway 'office' has no backend 'box-c'",
                "its backends: box-a, box-b")
        refused(cli("gateway", verb, str(path), "box-a"), f"the API key file {key_file} does not exist")
    key_file.write_text(f"VLLM_API_KEY={key}\n")
    key_file.chmod(0o644)
    refused(cli("gateway", "drain", str(path), "box-a"), "has mode 0644", f"chmod 0600 {key_file}")
    key_file.chmod(0o600)
    for verb in ("drain", "rejoin"):
        p = cli("gateway", verb, str(path), "box-a")
        refused(p, f"the router of gateway 'office' does not answer at http://127.0.0.1:{port}",
                "is the gateway running on this host?", "compose/gateways/office/compose.yaml")
        assert key not in p.stderr + p.stdout
