#!/usr/bin/env python3
"""Can this node reach ADDR:PORT? Run on a worker against the head's rendezvous port before anything starts.

Usage: port_probe.py ADDR PORT [TIMEOUT_S]. Prints one JSON line {"verdict", "errno", "detail"} and exits 0 when
the port is reachable, 1 when it is not. The head is not started yet, so nothing listens: a TCP RST
("connection refused") proves the path is open (the host answered), while a timeout or "no route" means a
firewall or routing problem the engine would hit as a hang at start-up. Standard library only: nodes run it with
their own Python.
"""

from __future__ import annotations

import errno
import json
import socket
import sys


def probe(addr: str, port: int, timeout_s: float = 5.0) -> dict:
    """Classify a TCP connect to addr:port.

    Returns:
        {"verdict": "open" (something listens) | "reachable" (refused: host answered, nothing listens) |
        "unreachable" (timeout, no route, network down), "errno": int | None, "detail": str}.
    """
    try:
        with socket.create_connection((addr, port), timeout=timeout_s):
            return {"verdict": "open", "errno": None, "detail": "something already listens"}
    except ConnectionRefusedError:
        return {"verdict": "reachable", "errno": errno.ECONNREFUSED, "detail": "connection refused (host answered)"}
    except TimeoutError:
        return {"verdict": "unreachable", "errno": errno.ETIMEDOUT, "detail": f"no answer within {timeout_s:g} s"}
    except OSError as exc:
        return {"verdict": "unreachable", "errno": exc.errno, "detail": exc.strerror or str(exc)}


def main(argv: list[str]) -> int:
    addr, port = argv[1], int(argv[2])
    result = probe(addr, port, float(argv[3]) if len(argv) > 3 else 5.0)
    print(json.dumps(result))
    return 0 if result["verdict"] != "unreachable" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
