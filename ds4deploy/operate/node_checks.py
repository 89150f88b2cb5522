"""`ds4deploy preflight --inventory`: the deploy's read-only checks of every node, the ones site.yml runs first.

Runs ansible/preflight.yml (the same playbook site.yml and provision.yml import before their first change) with the
run's variables already written (``ds4_vars_file``, `ds4deploy.plan.playvars.write_play_vars`), through Ansible's JSON
stdout callback (`ds4deploy.operate.playbook.run_json`), and prints one line per node: ``ok`` or each failed check's
message
(cause and fix). Nothing on any node is changed: the playbook's tasks only read (``changed_when: false``), and the
test of every refusal proves the nodes' state unchanged (tests/e2e/test_refusal_order.py).
"""

from __future__ import annotations

from pathlib import Path

from ds4deploy.operate import playbook

PLAYBOOK = "preflight.yml"


def verdict_lines(run: dict) -> list[str]:
    """What an ``ansible.posix.json`` run of ansible/preflight.yml says per node, one line each: ``<node>: ok``, or
    (when another node's check stopped the run, any_errors_fatal) ``<node>: not every check ran (the run stopped at
    another node)``; then ``failed: <host>: <task>: <message>`` for each failed or unreachable task
    (`ds4deploy.operate.playbook.failures`). The nodes are the hosts of every play after the first, which runs on the
    control
    host alone."""
    failed = playbook.failures(run)
    nodes = sorted({host for play in run.get("plays", [])[1:] for task in play.get("tasks", [])
                    for host in task.get("hosts", {})})
    fine = [n for n in nodes if not any(line.startswith(f"{n}: ") for line in failed)]
    state = "not every check ran (the run stopped at another node)" if failed else "ok"
    return [f"{n}: {state}" for n in fine] + [f"failed: {line}" for line in failed]


def read_nodes(recipe: str, inventory: str, vars_file: Path, model_from: Path | None = None) -> int:
    """Run ansible/preflight.yml for `recipe` on `inventory` and print each node's verdict.

    Args:
        recipe: recipe name.
        inventory: Ansible inventory file.
        vars_file: the run's variables (`ds4deploy.plan.playvars.write_play_vars`, scope ``deploy``).
        model_from: MODEL_FROM of the deploy (a local model copied from the control host: the nodes' copies are not
            checked then, as the deploy replaces them).

    Returns:
        0 when every node passed every check, else 1.

    Raises:
        UserError: ansible-playbook is missing, or its JSON output cannot be read (its stderr is quoted).
    """
    extra = [f"recipe={recipe}", f"ds4_vars_file={vars_file}",
             *([f"ds4_model_from={model_from.absolute()}"] if model_from else [])]
    done, run = playbook.run_json(PLAYBOOK, inventory, *extra,
                                  fix=f"run `ansible-playbook -i {inventory} ansible/{PLAYBOOK} -e recipe={recipe}` "
                                      "for Ansible's whole output")
    lines = verdict_lines(run)
    print("\n".join(lines))
    failed = any(line.startswith("failed: ") for line in lines)
    if done.returncode != 0 and not failed:
        print(f"failed: ansible-playbook {PLAYBOOK} exited {done.returncode}: {done.stderr.strip()[-800:]}")
    return 0 if done.returncode == 0 and not failed else 1
