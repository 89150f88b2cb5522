"""Bad stack-recipe input found by fuzzing the kinds of ../cases (bad-input-3, render-contract) again (2026-12-03):
each refused through the real CLI with one message naming the cause and the fix, exit 2, no traceback, nothing
written, no secret in the output; or, where the input is good and only the render was wrong, rendered right.

Every recipe here is `extends: <a committed recipe>` plus the few lines under test, rendered into a scratch
$DS4_COMPOSE_DIR, so a case passes only while the check it names is in place.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ds4deploy.core.errors import UserError
from ds4deploy.recipe.paths import REPO_ROOT

pytestmark = pytest.mark.tool  # the CLI in a subprocess

HEX = "9f8e7d6c5b4a39281706f5e4d3c2b1a0"


def _run(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ds4deploy.cli", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, check=False, timeout=120,
                          env={**os.environ, "DS4_COMPOSE_DIR": str(tmp_path / "out"), **(env or {})})


def _recipe(tmp_path: Path, body: str, base: str = "cpu") -> Path:
    path = tmp_path / "y.yaml"
    path.write_text(f"extends: {REPO_ROOT}/recipes/{base}.yaml\nname: y\n{body}\n")
    return path


def _refused(p: subprocess.CompletedProcess, tmp_path: Path, *words: str) -> None:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout and "\nfix: " in p.stderr, p.stderr
    for w in words:
        assert w in p.stderr, (w, p.stderr)
    assert HEX not in p.stderr + p.stdout
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.yaml")), \
        sorted((tmp_path / "out").rglob("*"))


CASES = {
    # YAML 1.1 forms that a YAML 1.2 reader (or the engine) reads otherwise, and numbers that are not finite.
    "octal": ("serving:\n  extra_args:\n    max-num-partial-prefills: 010", "cpu", "the number 8"),
    "base 60": ("serving:\n  extra_args:\n    block-size: 1:04", "cpu", "the number 64"),
    "binary": ("serving:\n  extra_args:\n    block-size: 0b11", "cpu", "the number 3"),
    "underscores": ("serving:\n  extra_args:\n    block-size: 1_000", "cpu", "the number 1000"),
    "word boolean off": ("serving:\n  extra_args:\n    kv-cache-dtype-skip: off", "cpu", "the boolean False"),
    "word boolean yes": ("serving:\n  extra_args:\n    enforce-eager: yes", "cpu", "the boolean True"),
    "infinite size": ("model:\n  size_on_disk_gb: .inf", "cpu", "is not a finite number"),
    "nan memory": ("hardware:\n  gpus:\n    memory_gib: .nan", "rtx3090x2-xeon-ds4-flash", "is not a finite number"),
    # Credentials that reached compose.yaml.
    "api key in a shell entrypoint": (
        f'engine:\n  entrypoint: [sh, -c, "exec python3 -m vllm.entrypoints.openai.api_server --api-key {HEX} '
        '\\"$@\\"", --]', "cpu", "credential flag in a command line"),
    "api key flag in an env value": (f'engine:\n  env:\n    VLLM_EXTRA: "--api-key {HEX}"', "cpu",
                                     "credential flag in a command line"),
    "token name without underscore": (f"engine:\n  env:\n    HFTOKEN: {HEX}", "cpu", "'HFTOKEN' names a credential"),
    "numbered token name": (f"engine:\n  env:\n    HF_TOKEN2: {HEX}", "cpu", "'HF_TOKEN2' names a credential"),
    "passphrase": ("engine:\n  env:\n    DB_PASSPHRASE: correcthorsebatterystaple", "cpu",
                   "'DB_PASSPHRASE' names a credential"),
    "a token as an env name": ('engine:\n  env:\n    hf_AbCdEfGhIjKlMnOpQrStUvWxYz: "1"', "cpu",
                               "a mapping key holds a credential"),
    "api key inside a JSON argument": (
        f"serving:\n  extra_args:\n    model-loader-extra-config: '{{\"api_key\": \"{HEX}\"}}'", "cpu",
        "'api_key' names a credential"),
    "api key in a flag name": (f'serving:\n  extra_args:\n    "api-key {HEX}": true', "cpu",
                               "a mapping key holds a credential"),
    "empty key over the key file": ('engine:\n  env:\n    VLLM_API_KEY: ""', "cpu", "VLLM_API_KEY name a credential"),
    # Paths that named a system directory past the checks.
    "model path //etc": ("model:\n  path: //etc", "cpu", "holds '//'"),
    "model path /usr/bin": ("model:\n  path: /usr/bin", "cpu", "a system tree"),
    "model path /boot/x": ("model:\n  path: /boot/models", "cpu", "a system tree"),
    "key file //etc": ("serving:\n  auth:\n    key_file: //etc/x.env", "cpu", "holds '//'"),
    "key file /usr/bin": ("serving:\n  auth:\n    key_file: /usr/bin/x.env", "cpu", "a system tree"),
    "key file dotdot": ("serving:\n  auth:\n    key_file: /etc/ds4deploy/../x.env", "cpu", "climbs out with '..'"),
    # Listen addresses nginx refuses.
    "scoped IPv6": ('serving:\n  bind_address: "fe80::1%eth0"', "cpu", "scoped IPv6 address"),
    "IPv4-mapped IPv6": ('serving:\n  bind_address: "::ffff:127.0.0.1"', "cpu", "write the IPv4 address 127.0.0.1"),
    # Flags that override the ones the render derives.
    "underscore spelling": ("serving:\n  extra_args:\n    max_model_len: 99", "cpu", "vLLM reads '_' as '-'"),
    "leading dashes": ('serving:\n  extra_args:\n    "--max-num-batched-tokens": 512', "cpu", "a vLLM flag as"),
    "capitals": ("serving:\n  extra_args:\n    Max-Num-Seqs: 64", "cpu", "a vLLM flag as"),
    "value in the name": ('serving:\n  extra_args:\n    "port=9999": true', "cpu", "a vLLM flag as"),
    "JSON key twice": ("serving:\n  extra_args:\n    structured-outputs-config: "
                       "'{\"backend\": \"xgrammar\", \"backend\": \"guidance\"}'", "cpu",
                       "key 'backend' written twice"),
    "llama.cpp short and long": ('engine:\n  llamacpp:\n    threads: 1\n    extra_args:\n      "-t": 4',
                                 "cpu-llamacpp", "-t (the render sets -t)"),
    "llama.cpp long for short": ("engine:\n  llamacpp:\n    threads: 1\n    extra_args:\n      threads: 4",
                                 "cpu-llamacpp", "--threads (the render sets -t)"),
    "llama.cpp ctx-size": ("engine:\n  llamacpp:\n    extra_args:\n      ctx-size: 99", "cpu-llamacpp",
                           "--ctx-size (the render sets -c)"),
    "llama.cpp alias": ("engine:\n  llamacpp:\n    extra_args:\n      alias: other", "cpu-llamacpp",
                        "--alias (the render sets -a)"),
    "llama.cpp key file": ("engine:\n  llamacpp:\n    extra_args:\n      api-key-file: /etc/passwd", "cpu-llamacpp",
                           "the API key is the deploy's"),
    "llama.cpp negation of a derived switch": ("engine:\n  llamacpp:\n    extra_args:\n      jinja: false",
                                               "cpu-llamacpp", "--no-jinja (the render sets --jinja)"),
    "llama.cpp false without negation": ("engine:\n  llamacpp:\n    extra_args:\n      metrics: false",
                                         "cpu-llamacpp", "has no negated form"),
    # A JSON flag's key in dot notation overriding what the render derives, and a double negative.
    "dot notation over the output cap": ("serving:\n  extra_args:\n    override-generation-config.max_new_tokens: 9",
                                         "cpu", "--override-generation-config.<key>, which the render already"),
    "dot notation over speculative": ("serving:\n  extra_args:\n    speculative-config.num_speculative_tokens: 9",
                                      "rtx3090x2-xeon-ds4-flash", "--speculative-config.num_speculative_tokens"),
    "llama.cpp double negative": ("engine:\n  llamacpp:\n    extra_args:\n      no-cont-batching: false",
                                  "cpu-llamacpp", "a double negative"),
    "model path through a dot folder": ("model:\n  path: /usr/./bin", "cpu", "a '.' folder"),
    "two rails of one name": ("fabric:\n  rails:\n    - {name: rail0, netdev: enp1s0f1np1, hcas: [rocep1s0f1], "
                              "subnet: 10.100.184.0/24, mtu: 9000}\n    - {name: rail0, netdev: enP2p1s0f1np1, "
                              "hcas: [roceP2p1s0f1], subnet: 10.100.185.0/24, mtu: 9000}", "gx10x2-ds4-flash-fp8",
                              "use the name rail0 twice"),
    "a negative stack size": ("container:\n  stack_bytes: -5", "cpu", "must be >= 1"),
    # Values Docker refuses at create or start, after the deploy changed the host.
    "engine name not a tag": ('engine:\n  name: "vLLM CPU/x"', "cpu", "engine.name"),
    "log size in words": ('container:\n  log_max_size: "fifty megs"', "cpu", "container.log_max_size"),
    "log files beyond an int": ("container:\n  log_max_files: 99999999999999999999", "cpu", "must be <= 100"),
    "user with a command": ('engine:\n  image:\n    user: "nobody; id"', "cpu", "engine.image.user"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_recipes_are_refused_and_nothing_is_written(tmp_path: Path, case: str) -> None:
    body, base, words = CASES[case]
    _refused(_run(tmp_path, "render", str(_recipe(tmp_path, body, base))), tmp_path, words)


def test_numbers_both_yaml_versions_read_alike_pass() -> None:
    """00 and 007 are 0 and 7 to YAML 1.1 (octal) and 1.2 (decimal) alike; 0x1F, 1e-5, -1 and 1.0 too."""
    from ds4deploy.core.yamlio import parse_strict

    doc = parse_strict("a: 00\nb: 007\nc: 0x1F\nd: 1.0e-5\ne: -1\nf: 1.0\ng: 0\n", "t.yaml", recipe=True)
    assert doc.data == {"a": 0, "b": 7, "c": 31, "d": 1e-5, "e": -1, "f": 1.0, "g": 0}
    with pytest.raises(UserError, match="the number 8"):
        parse_strict("a: 010\n", "t.yaml")


def test_one_recipe_named_twice_renders_once_and_two_recipes_of_one_name_are_refused(tmp_path: Path) -> None:
    p = _run(tmp_path, "render", "cpu", "cpu", str(REPO_ROOT / "recipes" / "cpu.yaml"))
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "out" / "cpu" / "compose.yaml").read_text() == (
        REPO_ROOT / "compose" / "cpu" / "compose.yaml").read_text()
    other = tmp_path / "other" / "cpu.yaml"
    other.parent.mkdir()
    other.write_text(f"extends: {REPO_ROOT}/recipes/cpu.yaml\nname: cpu\nserving:\n  port: 8111\n")
    _refused(_run(tmp_path / "two", "render", "cpu", str(other)), tmp_path / "two", "both named 'cpu'")


def test_a_file_where_a_render_goes_stops_every_render_first(tmp_path: Path) -> None:
    """`render cpu cpu-llamacpp` with a file named cpu-llamacpp in the render folder: refused before cpu/ is
    written (cpu/ was swapped in, then NotADirectoryError)."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "cpu-llamacpp").write_text("mine")
    p = _run(tmp_path, "render", "cpu", "cpu-llamacpp")
    assert p.returncode == 2 and "is not a directory" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert sorted(x.name for x in (tmp_path / "out").iterdir()) == ["cpu-llamacpp"]


def test_validate_renders_a_named_recipes_variants(tmp_path: Path) -> None:
    """A variant whose engine argument cannot be rendered: `recipe validate <file>` said ok and exited 0."""
    path = _recipe(tmp_path, "variants:\n  fast:\n    serving.extra_args.speculative-config: '{bad'")
    p = _run(tmp_path, "recipe", "validate", str(path))
    assert p.returncode == 2 and "variant y--fast: serving.extra_args.speculative-config: not valid JSON" in p.stderr, \
        p.stderr


def test_an_inventory_cpu_bind_cannot_add_a_line_to_the_env_file(tmp_path: Path) -> None:
    """ds4_cpu_bind becomes DS4_CPU_BIND=<value> in the stack's .env: a newline there added DS4_MODEL_DIR=/etc."""
    inv = (REPO_ROOT / "ansible" / "inventories" / "two-node-local.yml").read_text()
    bad = tmp_path / "inv.yml"
    bad.write_text(inv.replace('ds4_cpu_bind: "1"', 'ds4_cpu_bind: "0\\nDS4_MODEL_DIR=/etc"', 1))
    assert bad.read_text() != inv
    # The committed renders (vars checks them fresh); a refusal writes no variables file.
    p = _run(tmp_path, "vars", "cpu-2node-tp", "--inventory", str(bad),
             env={"DS4_COMPOSE_DIR": str(REPO_ROOT / "compose")})
    _refused(p, tmp_path, "which cannot be one value of the stack's .env", "VLLM_CPU_OMP_THREADS_BIND")


def test_every_spelling_of_a_wildcard_ipv6_listen_reaches_ipv4_too() -> None:
    """bind_address '::' with host networking: nginx's [::] socket is IPv6 only unless told, and the healthcheck
    probes 127.0.0.1."""
    from ds4deploy.recipe.load import load_recipe
    from ds4deploy.render import front_door

    r = load_recipe("cpu")
    host = r.model_copy(update={"serving": r.serving.model_copy(update={"bind_address": "::",
                                                                        "network_mode": "host"})})
    for wildcard in ("::", "0::0", "0:0:0:0:0:0:0:0"):
        host = r.model_copy(update={"serving": r.serving.model_copy(update={"bind_address": wildcard,
                                                                            "network_mode": "host"})})
        assert front_door.listen(host) == f"[::]:{r.serving.port} ipv6only=off", wildcard


def test_good_inputs_next_to_the_new_checks_still_render(tmp_path: Path) -> None:
    """What a user legitimately writes beside the refused shapes: models on a desktop's mounted disk or where a
    packaged server keeps them, vLLM's list syntax in dot notation."""
    for body in ("model:\n  path: /run/media/ann/disk/models/tiny", "model:\n  path: /usr/share/ollama/models/tiny",
                 "serving:\n  extra_args:\n    compilation-config.custom_ops+: none"):
        p = _run(tmp_path, "recipe", "validate", str(_recipe(tmp_path, body)))
        assert p.returncode == 0, (body, p.stderr)


def test_an_inventory_that_is_a_pipe_is_refused_not_read_forever(tmp_path: Path) -> None:
    fifo = tmp_path / "inv.yml"
    os.mkfifo(fifo)
    p = _run(tmp_path, "vars", "cpu", "--inventory", str(fifo), env={"DS4_COMPOSE_DIR": str(REPO_ROOT / "compose")})
    _refused(p, tmp_path, "is neither a file nor a folder")
