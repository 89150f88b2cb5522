"""Reload a running nginx front door gracefully and wait until the reload took effect.

``nginx -s reload`` only signals the master: the master then parses the configuration again, starts new worker
processes and tells the old ones to stop accepting connections and finish what they hold (nginx documentation,
"Controlling nginx", https://nginx.org/en/docs/control.html: "Changing Configuration"). Until the old workers got
that order they still accept new connections with the old configuration, so a revoked key would still open the
door for a moment; and when the new configuration fails to apply, the master only logs it and keeps the old
workers. `reload` therefore returns only once every worker that ran before has stopped accepting (its process title
is "nginx: worker process is shutting down", or it is gone) and a new worker runs, and says why when that does not
happen.
"""

from __future__ import annotations

import subprocess
import time

from ds4deploy.core.errors import UserError

# Process titles nginx gives its workers (src/os/unix/ngx_process_cycle.c: "worker process", and on a graceful
# stop "worker process is shutting down").
WORKER = "nginx: worker process"
SHUTTING_DOWN = "nginx: worker process is shutting down"
# Seconds to wait for the new workers: a reload swaps them in well under a second on an idle host, and the wait is
# mostly `docker exec` round trips (`workers`). On the 2-core CI host, while another client of the same Docker daemon
# removed and loaded a 4 GB image (make test's last phase: tests/offline beside tests/gateway), a 30 s bound was
# exceeded once; 120 s bounds a daemon that busy and still names a reload that never takes.
RELOAD_TIMEOUT_S = 120.0
# Lists every process of the container as "<pid> <title>" from /proc (the front door image has no ps). A process can
# end between the glob and the read (an old worker finishing its last request, the list's own `tr`): its stderr is
# discarded before its input is opened (redirections apply left to right), and the list ends with `true`, so such a
# process is left out instead of failing the list (a make test run's redeploy failed on "cannot open
# /proc/42/cmdline", 2026-12-03).
_LIST = ('for d in /proc/[0-9]*; do t=$(tr "\\0" " " 2>/dev/null < "$d/cmdline"); '
         '[ -n "$t" ] && echo "${d#/proc/} $t"; done; true')


# Seconds one docker command may take before the front door counts as not answering: a docker exec answers in well
# under a second on an idle host, and much later on one whose daemon is loading a large image (see RELOAD_TIMEOUT_S).
DOCKER_TIMEOUT_S = 120
# How docker's output is read: a process title is whatever bytes its program wrote into its argv, not necessarily
# UTF-8 (CI's make test failed on a byte 0x80 in one, 2026-12-03); such bytes become U+FFFD instead of failing the list.
DECODE = {"encoding": "utf-8", "errors": "replace"}


def _docker(args: list[str]) -> subprocess.CompletedProcess:
    """``docker <args>`` with its output captured.

    Raises:
        UserError: docker is missing or did not answer within `DOCKER_TIMEOUT_S`.
    """
    try:
        return subprocess.run(["docker", *args], capture_output=True, timeout=DOCKER_TIMEOUT_S, check=False,
                              **DECODE)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"`docker {args[0]}` on the front door failed: {exc}",
                        "check that Docker runs and the front door is up (`docker ps`)") from None


def workers(container: str) -> dict[int, str]:
    """The nginx worker processes of `container`: pid -> process title (`WORKER` or `SHUTTING_DOWN`).

    Raises:
        UserError: docker cannot run a command in the container (not running, docker missing).
    """
    p = _docker(["exec", container, "sh", "-c", _LIST])
    if p.returncode != 0:
        raise UserError(f"could not read the processes of {container}: {(p.stderr or p.stdout).strip()[-300:]}",
                        "check that the front door is up (`docker ps`)")
    out = {}
    for line in p.stdout.splitlines():
        pid, _, title = line.partition(" ")
        if title.strip().startswith(WORKER):
            out[int(pid)] = title.strip()
    return out


def reload(container: str, conf: str, timeout_s: float = RELOAD_TIMEOUT_S, interval_s: float = 0.2) -> int:
    """`nginx -s reload -c conf` in `container`, then wait until every worker that ran before stopped accepting and
    a new one runs (module docstring). Returns the number of new workers.

    Raises:
        UserError: the reload was refused (the configuration does not parse: nginx's own message), or the new
            workers did not take over within `timeout_s` seconds (the container log's last lines say why).
    """
    before = workers(container)
    p = _docker(["exec", container, "nginx", "-s", "reload", "-c", conf])
    if p.returncode != 0:
        raise UserError(f"the front door {container} refused the reload: {(p.stderr or p.stdout).strip()[-300:]}",
                        "fix what nginx names; the running configuration is unchanged")
    deadline = time.monotonic() + timeout_s
    while True:
        now = workers(container)
        old_accepting = [pid for pid in before if now.get(pid) == WORKER]
        new = [pid for pid, title in now.items() if pid not in before and title == WORKER]
        if new and not old_accepting:
            return len(new)
        if time.monotonic() >= deadline:
            log = _docker(["logs", "--tail", "5", container])
            tail = " | ".join((log.stderr + log.stdout).strip().splitlines()[-3:])
            raise UserError(f"the front door {container} did not take the new configuration within {timeout_s:g} s "
                            f"(old workers still accepting: {len(old_accepting)}, new: {len(new)}; log: {tail})",
                            "read `docker logs` of the front door, fix the configuration it names, run again")
        time.sleep(interval_s)
