#!/usr/bin/env python3
"""Can the workers reach the head's rendezvous port? Checked before any engine starts.

    port_probe.py listen PORT SECONDS [N]  on the head: accept connections on PORT until N have come (one per
                                           worker) or SECONDS have passed, then exit and free the port
    port_probe.py ADDR PORT [TIMEOUT_S]    on a worker: connect; prints {"verdict", "errno", "detail"}

The head listens first (the deploy starts it in the background), so a worker's connect must succeed ("open").
Why not just read "connection refused" as "reachable": a firewall REJECT rule answers exactly like a closed port
(ICMP port-unreachable or a TCP reset both surface as ECONNREFUSED), and on this project's CI machine even the
never-routed TEST-NET-1 address 192.0.2.1 answers "refused"; only a real listener proves the path. Exit codes:
0 open, 1 not open, 2 the head could not listen (the port is in use: an engine of an earlier deploy still runs).
Standard library only: nodes run it with their own Python.
"""

from __future__ import annotations

import errno
import json
import socket
import sys


def probe(addr: str, port: int, timeout_s: float = 5.0) -> dict:
    """Classify a TCP connect to addr:port.

    Returns:
        {"verdict": "open" (connected) | "refused" (nothing listens, or a firewall rejects) |
        "unreachable" (timeout, no route, network down), "errno": int | None, "detail": str}.
    """
    try:
        with socket.create_connection((addr, port), timeout=timeout_s):
            return {"verdict": "open", "errno": None, "detail": "something already listens"}
    except ConnectionRefusedError:
        return {"verdict": "refused", "errno": errno.ECONNREFUSED,
                "detail": "connection refused (nothing listens, or a firewall rejects)"}
    except TimeoutError:
        return {"verdict": "unreachable", "errno": errno.ETIMEDOUT, "detail": f"no answer within {timeout_s:g} s"}
    except OSError as exc:
        return {"verdict": "unreachable", "errno": exc.errno, "detail": exc.strerror or str(exc)}


def listen(port: int, seconds: float, expected: int | None = None) -> int:
    """Accept (and close) connections on 0.0.0.0:port until `expected` connections have come (every worker probed)
    or `seconds` have passed. Returns 0, or 2 when the port is taken.

    Leaving as soon as every worker has probed frees the port for the head's engine: a listener that kept it for the
    whole `seconds` made a head that started sooner fail to bind its master port (found by the rehearsal).
    """
    import time

    try:
        srv = socket.create_server(("0.0.0.0", port), reuse_port=False)  # noqa: S104 (the fabric address is unknown)
    except OSError as exc:
        print(json.dumps({"verdict": "in-use", "errno": exc.errno, "detail": exc.strerror or str(exc)}))
        return 2
    print(json.dumps({"verdict": "listening", "errno": None, "detail": f"port {port} for {seconds:g} s"}), flush=True)
    deadline = time.monotonic() + seconds
    accepted = 0
    with srv:
        while (left := deadline - time.monotonic()) > 0:
            srv.settimeout(left)
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                break
            conn.close()
            accepted += 1
            if expected is not None and accepted >= expected:
                break
    return 0


def main(argv: list[str]) -> int:
    if argv[1] == "listen":
        return listen(int(argv[2]), float(argv[3]), int(argv[4]) if len(argv) > 4 else None)
    addr, port = argv[1], int(argv[2])
    result = probe(addr, port, float(argv[3]) if len(argv) > 3 else 5.0)
    print(json.dumps(result))
    return 0 if result["verdict"] == "open" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
