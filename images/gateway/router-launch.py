"""Start SMG's router with its worker key from the environment, never from the command line.

SMG 1.13.0 takes the key it presents to the workers (and requires of its own callers) only as ``--api-key <key>``
(smg/router_args.py, ``RouterArgs.api_key``), which would put the key in the process's argv (``ps``, /proc, the
container's recorded command). This launcher parses the same flags with SMG's own parser
(``smg.launch_router.parse_router_args``), sets ``api_key`` from ``VLLM_API_KEY`` (the gateway key file,
through the compose env_file), drops the variable from the environment and starts the router exactly as ``smg
launch`` does (``smg.launch_router.launch_router``).

Exit 1 with "error: ... / fix: ..." when the key is missing, or passed on the command line.
"""

import os
import re
import sys

from smg.launch_router import launch_router, parse_router_args


def main() -> None:
    """Parse SMG's flags from argv, add the key from the environment, run the router (blocks until it stops)."""
    if any(a == "--api-key" or a.startswith("--api-key=") for a in sys.argv[1:]):
        sys.exit("error: --api-key on the command line\nfix: the key comes from VLLM_API_KEY (the gateway key "
                 "file); remove the flag")
    key = os.environ.pop("VLLM_API_KEY", "")
    # The same alphabet the front door admits for keys (images/proxy/entrypoint.sh).
    if not re.fullmatch(r"[A-Za-z0-9_-]+", key):
        sys.exit("error: VLLM_API_KEY is empty or holds characters other than A-Z a-z 0-9 _ -\nfix: the gateway "
                 "key file must hold one VLLM_API_KEY=<key> line: delete it and deploy again to regenerate it")
    args = parse_router_args(sys.argv[1:])
    args.api_key = key
    launch_router(args)


if __name__ == "__main__":
    main()
