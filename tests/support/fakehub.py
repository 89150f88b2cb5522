"""A local HTTP server that speaks the part of the Hugging Face Hub protocol huggingface_hub uses to download a
pinned revision, so `ds4deploy model fetch`/`manifest` are tested end to end without network access.

Endpoints (as the hub serves them):
  GET  /api/models/<ns>/<name>/revision/<rev>   model info: sha, siblings (rfilename, size, blobId, lfs)
  GET  /api/models/<ns>/<name>/tree/<rev>       file listing: type, path, size, oid, lfs
  GET  /api/models/<ns>/<name>/refs             branches (main -> the commit), converts, tags
  GET  /api/models/<ns>/<name>/commits/<rev>    the commits reachable from rev, newest first: id, title, message,
                                                authors, date (paged with a Link header, as the hub pages lists)
  POST /api/models/<ns>/<name>/paths-info/<rev> form field `paths` (repeated): type, path, size, oid, lfs of each
                                                existing path (unknown paths are left out, as on the hub)
  HEAD /<ns>/<name>/resolve/<rev>/<file>        X-Repo-Commit, ETag, Content-Length
  GET  /<ns>/<name>/resolve/<rev>/<file>        the bytes (Range supported, for resumed downloads)
Unknown repositories answer 404 with X-Error-Code RepoNotFound, unknown revisions RevisionNotFound, missing files
EntryNotFound: the codes huggingface_hub maps to its exceptions. A revision may be a prefix (>= 7 hex) of the
commit, as on the hub since 2023 (huggingface_hub issue #197), or "main". `history` adds older commits (newest
first, after `sha`) to the commit listing, e.g. two commits that share a prefix; they serve the same files.
Request shapes follow huggingface_hub's client (`HfApi.list_repo_refs`, `list_repo_commits` with its `paginate`
Link-header paging, `get_paths_info`'s form POST).

Fault injection: `missing` (listed but 404 on download), `served` (other bytes than the real ones, e.g. a
corrupted byte or a padded file), `cuts` (the next N downloads of a file stop at a byte offset and the
connection is closed: a cut connection), `trickles` (the next N downloads of a file send their headers, then one
byte every `interval` seconds, or with interval None no body at all, until the client goes or the hub stops).
`requests` logs every file request with its Range header; `held` counts the trickled transfers in progress, which
`HeldClock` turns into time for the fetch stall watchdog.
"""

from __future__ import annotations

import hashlib
import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LFS_THRESHOLD = 10_000  # bytes; larger files are "LFS" files with a sha256, as on the hub


class FakeHub:
    """Serve `files` (name -> bytes) as repository `repo_id` at commit `sha` on 127.0.0.1:<port>."""

    # Commits per page of the commit listing: small, so the tests exercise huggingface_hub's Link-header paging.
    COMMITS_PER_PAGE = 2

    def __init__(self, repo_id: str, sha: str, files: dict[str, bytes], history: list[str] | None = None) -> None:
        self.repo_id, self.sha, self.files = repo_id, sha, dict(files)
        self.history = list(history or [])  # older commits, newest first
        self.missing: set[str] = set()  # listed in the metadata but 404 on download
        self.served: dict[str, bytes] = {}  # what download returns instead of the real bytes (corruption tests)
        self.cuts: dict[str, list[int]] = {}  # name -> [offset, count]: the next `count` GETs stop at `offset`
        # name -> [interval seconds or None, count]: the next `count` GETs trickle their body (None: send none)
        self.trickles: dict[str, list] = {}
        self.stopping = threading.Event()
        self.held = 0  # trickled transfers in progress (headers sent, body held back)
        self.requests: list[tuple[str, str, str | None]] = []  # (method, file name, Range header) per file request
        self.paths_info: list[list[str]] = []  # the paths of each paths-info request
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()

    def siblings(self) -> list[dict]:
        out = []
        for name, data in sorted(self.files.items()):
            blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data, usedforsecurity=False).hexdigest()
            s = {"rfilename": name, "size": len(data), "blobId": blob}
            if len(data) > LFS_THRESHOLD:
                s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            out.append(s)
        return out

    def commits(self) -> list[str]:
        """Every commit of the repository, newest first: `sha` (the head of main), then `history`."""
        return [self.sha, *self.history]

    def tree(self) -> list[dict]:
        """The files as the hub's tree and paths-info endpoints list them (type, path, size, oid, lfs)."""
        return [{"type": "file", "path": s["rfilename"], "size": s["size"], "oid": s["blobId"],
                 **({"lfs": {"oid": s["lfs"]["sha256"], "size": s["size"], "pointerSize": 134}}
                    if "lfs" in s else {})} for s in self.siblings()]

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _error(self, code: str, status: int = 404) -> None:
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("Content-Type", "application/json")
                body = json.dumps({"error": code}).encode()
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _route(self):
                path = self.path.split("?", 1)[0]
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) == 5 and parts[4] == "refs":
                    return "refs", "/".join(parts[2:4]), "main", None
                if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree", "commits",
                                                                                      "paths-info"):
                    kind = {"revision": "info"}.get(parts[4], parts[4])
                    return kind, "/".join(parts[2:4]), parts[5], None
                if len(parts) >= 5 and parts[2] == "resolve":
                    return "file", "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                return None, None, None, None

            def _check(self, repo, rev) -> bool:
                if repo != hub.repo_id:
                    self._error("RepoNotFound")
                    return False
                if rev != "main" and not (len(rev) >= 7 and any(c.startswith(rev) for c in hub.commits())):
                    self._error("RevisionNotFound")
                    return False
                return True

            def do_GET(self) -> None:
                self._serve(body=True)

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_POST(self) -> None:
                from urllib.parse import parse_qs

                kind, repo, rev, _ = self._route()
                if kind != "paths-info":
                    self._error("NotFound")
                    return
                if not self._check(repo, rev):
                    return
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(length).decode())
                wanted = set(form.get("paths", []))
                with hub._lock:
                    hub.paths_info.append(sorted(wanted))
                self._json([e for e in hub.tree() if e["path"] in wanted])

            def _json(self, doc, body: bool = True, headers: dict | None = None) -> None:
                data = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def _commits_page(self, body: bool) -> None:
                from urllib.parse import parse_qs, urlsplit

                page = int(parse_qs(urlsplit(self.path).query).get("p", ["0"])[0])
                ids = hub.commits()
                n = hub.COMMITS_PER_PAGE
                doc = [{"id": c, "title": f"commit {i}", "message": "", "authors": [{"user": "ds4"}],
                        "date": f"2026-07-{31 - i:02d}T12:00:00.000Z"} for i, c in enumerate(ids)]
                doc = doc[page * n:(page + 1) * n]
                headers = {}
                if (page + 1) * n < len(ids):
                    base = self.path.split("?", 1)[0]
                    headers["Link"] = f'<{hub.endpoint}{base}?p={page + 1}>; rel="next"'
                self._json(doc, body, headers)

            def _hold(self, seconds: float) -> bool:
                """Wait `seconds` before the next trickled byte; False when the hub stops or the client has closed
                the connection first (a stopped download must not count as held)."""
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    if hub.stopping.wait(min(0.05, max(0.0, end - time.monotonic()))):
                        return False
                    if select.select([self.connection], [], [], 0)[0]:
                        try:
                            if self.connection.recv(1, socket.MSG_PEEK) == b"":
                                return False
                        except OSError:
                            return False
                return True

            def _serve(self, body: bool) -> None:
                kind, repo, rev, name = self._route()
                if kind is None:
                    self._error("NotFound")
                    return
                if not self._check(repo, rev):
                    return
                if kind == "refs":
                    self._json({"branches": [{"name": "main", "ref": "refs/heads/main", "targetCommit": hub.sha}],
                                "converts": [], "tags": []}, body)
                    return
                if kind == "commits":
                    self._commits_page(body)
                    return
                if kind in ("info", "tree"):
                    if kind == "info":
                        sha = next(c for c in hub.commits() if (rev == "main" and c == hub.sha) or c.startswith(rev))
                        doc = {"id": hub.repo_id, "modelId": hub.repo_id, "sha": sha,
                               "siblings": hub.siblings(), "private": False}
                    else:
                        doc = hub.tree()
                    self._json(doc, body)
                    return
                with hub._lock:
                    hub.requests.append((self.command, name, self.headers.get("Range")))
                if name not in hub.files or name in hub.missing:
                    self._error("EntryNotFound")
                    return
                real = hub.files[name]
                data = hub.served.get(name, real)
                etag = hashlib.sha256(real).hexdigest() if len(real) > LFS_THRESHOLD else hashlib.sha1(
                    f"blob {len(real)}\0".encode() + real, usedforsecurity=False).hexdigest()
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    start = int(rng[6:].split("-")[0] or 0)
                chunk = data[start:]
                cut = None
                trickle = False
                with hub._lock:
                    if body and hub.cuts.get(name, [0, 0])[1] > 0:
                        hub.cuts[name][1] -= 1
                        cut = hub.cuts[name][0]
                    if body and hub.trickles.get(name, [None, 0])[1] > 0:
                        hub.trickles[name][1] -= 1
                        trickle, interval = True, hub.trickles[name][0]
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", hub.sha)
                self.send_header("ETag", f'"{etag}"')
                self.send_header("Content-Length", str(len(chunk)))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if trickle:
                    self.wfile.flush()
                    with hub._lock:
                        hub.held += 1
                    try:
                        for i in range(len(chunk)):
                            if not self._hold(3600 if interval is None else interval):
                                break
                            try:
                                self.wfile.write(chunk[i:i + 1])
                                self.wfile.flush()
                            except OSError:  # the client went away
                                break
                    finally:
                        with hub._lock:
                            hub.held -= 1
                    self.close_connection = True
                    return
                if cut is not None:
                    # The headers promised len(chunk) bytes; send up to the cut offset, then drop the connection.
                    self.wfile.write(data[start:max(start, cut)])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if body:
                    self.wfile.write(chunk)

        return Handler


class HeldClock:
    """A clock for the fetch stall watchdog (`ds4deploy.model.fetch.download_watched`'s `clock`): real seconds, plus
    `step` seconds every time it is read while `hub` holds a transfer back (`FakeHub.held`). The watchdog then sees
    its production window pass during a real hold after a few reads, and never while bytes flow, however slow the
    host: no test waits out a stall window in real time.
    """

    def __init__(self, hub: FakeHub, step: float) -> None:
        self.hub, self.step, self.skipped = hub, step, 0.0

    def __call__(self) -> float:
        if self.hub.held:
            self.skipped += self.step
        return time.monotonic() + self.skipped
