"""The supervisor's target for a deployed gateway (`ds4deploy supervise <gateway>`; docs/gateway.md, "The supervisor").

`ds4deploy.operate.supervisor.supervise` judges a gateway as it judges a stack, with the `Policy` defaults (a check
every 10 s, a restart after 2 failed /health checks in a row, at most 5 restarts an hour, backoff 10 s doubling to
300 s: their sources are in `Policy`); what it watches and how it restarts differ:

- containers: the gateway's compose project (``ds4-gw-<name>``: the router and the front door, or the front door
  alone with ``routing.router: nginx``) on the gateway host, its Docker daemon reached as for a stack's node (local,
  or ``DOCKER_HOST=ssh://<host>``: `ds4deploy.operate.incidents.docker_env`). A container that exited, was paused or
  removed is ``engine-down`` at once; the daemon not answering is waited for, unbudgeted, as for a stack.
- health: the front door's ``GET /health``, without a key (the door answers it for anyone). The door answers it
  through the router (its rendered ``location = /health`` proxies to the router's ``/health``: SMG's own basic health,
  not its per-worker ``/readiness``, as SMG's API reference describes them, lightseekorg/smg
  docs/reference/api/extensions.md, not measured here against the pinned 1.13.0; with the nginx router, a
  backend's ``/health``, nginx trying the next backend on an error), so one 200 proves both containers answer.
- reading: none. A gateway has no engine counters, so the policy sees it as idle and never busy.
- progress: no probe of its own; the door's /health is enough. An idle stack gets a one-token completion because
  its /health can answer while its engine is frozen; a gateway's /health has already passed through both of its
  processes (door and router), and what lies behind them, the backends, is not the gateway's to restart. A
  completion through the door would need a person's key, which the supervisor holds none of; the router's own
  ``/liveness`` on its loopback port would repeat what the door's /health just proved, and is out of reach of a
  control host that is not the gateway host.
- collect: the router's and the door's logs and states into ``/var/lib/ds4deploy/incidents/gateway-<name>/`` (as
  `ds4deploy gateway collect` and `make down` save them).
- restart: ansible/gateway-restart.yml, which recreates the gateway's containers from the copy the deploy placed on
  the gateway host (``docker compose up --force-recreate --wait``, healthchecks waited for); the committed render,
  the key files and the people maps are not touched.

What it does not watch: the backends. A backend that is down is the router's to route around (`make status`
lists it ``not_ready``) and its own stack's supervisor's to restart; with the nginx router every backend down
fails the door's /health, so the supervisor restarts the gateway up to its budget and gives up (exit 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ds4deploy.operate import gateway_deploy
from ds4deploy.operate.incidents import Incident, collect_projects
from ds4deploy.operate.progress import Reading
from ds4deploy.operate.supervisor import get_health, project_state, run_playbook
from ds4deploy.recipe.schema import GatewayRecipe
from ds4deploy.render import gateway


def is_gateway(name: str) -> bool:
    """True when `name` names a gateway recipe (recipes/gateways/<name>.yaml exists), not a stack recipe."""
    return "/" not in name and (gateway.gateways_dir() / f"{name}.yaml").is_file()


@dataclass(frozen=True)
class GatewayHost:
    """The gateway host as the supervisor's journal names a node: its inventory name, role ``gateway``."""

    name: str
    role: str = "gateway"


@dataclass
class GatewayTarget:
    """What to watch on a deployed gateway: its containers on the gateway host, its front door's /health; how to
    restart it (see the module's docstring for each choice)."""

    recipe: GatewayRecipe
    inventory: Path
    host: str
    url: str
    hosts: dict[str, dict] = field(default_factory=dict)

    @property
    def nodes(self) -> list[GatewayHost]:
        """The one host the gateway runs on (for the journal's start record)."""
        return [GatewayHost(self.host)]

    def container_states(self) -> dict[str, str]:
        """{gateway host: the state of the gateway's containers} (`ds4deploy.operate.supervisor.project_state`)."""
        return {self.host: project_state(self.host, self.hosts.get(self.host, {}), gateway.project_name(self.recipe))}

    def health(self, timeout_s: float = 5) -> tuple[bool, str]:
        """The front door's GET /health: (ok, detail)."""
        return get_health(self.url, timeout_s)

    def reading(self, timeout_s: float = 5) -> tuple[Reading | None, str]:
        """No reading: a gateway has no engine counters (the policy then treats it as idle)."""
        return None, "a gateway has no engine counters"

    def progress(self, timeout_s: float) -> tuple[bool, str]:
        """Always progressed: the door's /health, just answered, went through the router (module docstring)."""
        return True, "no probe: the door's /health answered through the router"

    def collect(self, reason: str) -> Incident:
        """Save the gateway's containers' logs and states (`ds4deploy.operate.incidents.collect_projects`, as
        `ds4deploy gateway collect` does)."""
        return collect_projects(f"gateway-{self.recipe.name}",
                                [(self.host, "gateway", gateway.project_name(self.recipe))], self.hosts, reason)

    def restart(self, timeout_s: float, log: Path, incident: Path | None = None) -> tuple[bool, float]:
        """Run ansible/gateway-restart.yml (the gateway's containers recreated from its deployed copy, healthchecks
        waited for). Returns (ok, seconds). `incident` is not passed on: `collect` saved it already and the
        playbook saves none."""
        return run_playbook("gateway-restart.yml", self.inventory, [f"gateway={self.recipe.name}"], timeout_s, log)


def make_gateway_target(gw: GatewayRecipe, inventory: Path, url: str | None = None) -> GatewayTarget:
    """Find the gateway host in the inventory (`ds4deploy.operate.gateway_deploy.gateway_host`) and the URL the
    control host reaches the front door at (`ds4deploy.operate.gateway_deploy.control_url`), unless `url` is given.

    Raises:
        UserError: no single gateway host in the inventory; the door listens on loopback of a host that is not this
            control host (the supervisor could never reach it, and would restart a healthy gateway).
    """
    from ds4deploy.plan.inventory import read_inventory

    inv = read_inventory(inventory)
    host = gateway_deploy.gateway_host(gw, inv)
    return GatewayTarget(gw, inventory, host, url or gateway_deploy.control_url(gw, inv), inv.hosts)
