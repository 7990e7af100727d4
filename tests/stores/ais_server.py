"""A small AIStore-REST server for tests (aiohttp), run as its own process: a gateway and a target.

    python tests/stores/ais_server.py --data-dir DIR [--gcs-endpoint http://127.0.0.1:PORT]
        [--deny REGEX] [--ready-file F]

The surface of a real AIStore cluster that a client needs, on two ports:

* gateway ``GET /v1/objects/<bucket>/<object>?provider=P`` -> **301** to the target (same path
  and query plus ``&pid=..&utm=..``); ``HEAD`` and ``PUT`` -> **307**. ``GET /v1/health`` -> 200.
* target: ``GET`` -> 200, or 206 for ``Range:``, with ``Content-Length``, ``ETag``,
  ``Ais-Checksum-Type`` (``md5``: xxhash is not installable here), ``Ais-Checksum-Value``,
  ``Ais-Atime``, ``Ais-Version``; ``HEAD`` -> the same headers plus ``Ais-Present: true``;
  ``PUT`` stores the body. A missing object -> 404 with a JSON body (``message``, ``status``, ..).
* ``provider=ais`` objects live in ``DIR/ais/<bucket>/``. ``provider=gcp`` (alias ``gs``) reads
  through to fake-gcs (``--gcs-endpoint``): a cold GET fetches the object and keeps a copy in
  ``DIR/gcp/``; a PUT writes through to fake-gcs (media upload) and keeps the copy. Other
  providers answer 400.
* gateway ``GET /v1/buckets/<bucket>?provider=P`` with the JSON body ``{"action": "list",
  "value": {"prefix", "props", "continuation_token"[, "pagesize"]}}`` -> ``{"entries": [{"name",
  "size"}, ...], "continuation_token": ""}``, names sorted, ``page_size`` (1000) per page, the
  token naming the last name given until the last page. ``provider=ais`` lists
  ``DIR/ais/<bucket>/``; ``provider=gcp`` lists fake-gcs (the remote bucket, as AIStore does).
  A bucket that does not exist -> 404 JSON.
* paths matching ``--deny`` (a regex searched in the path; for a listing, in the path plus
  ``/`` and the prefix) -> 403 JSON, on both ports.

Through a proxy: the gateway redirects to the target port when the request's ``Host`` is its own
address; otherwise (a proxy that keeps the client's Host, like faultproxy.py) it redirects to that
same host, and a request that carries ``pid=`` is then served by the gateway port itself, so the
data also flows through the proxy.

Test control on the gateway: ``GET /__ais__/stats`` (``requests`` {role: {method: {status: n}}},
``cold_fetches``, ``log`` [{role, method, path, query, range, status}]), ``POST /__ais__/reset``
(clears the stats), ``POST /__ais__/evict`` (drops the copies of remote objects),
``POST /__ais__/config`` (``{"deny": REGEX, "page_size": N}``, either or both).
Only the standard library and aiohttp are imported, so the file runs as a plain script.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import sys
import time
import uuid
from collections import Counter, defaultdict, deque
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from aiohttp import ClientSession, ClientTimeout, web

log = logging.getLogger("ais_server")

PROVIDERS = {"ais": "ais", "gcp": "gcp", "gs": "gcp", "aws": "aws", "s3": "aws",
             "azure": "azure", "az": "azure", "oci": "oci"}
_OBJECTS = "/v1/objects/"
_BUCKETS = "/v1/buckets/"
PAGE_SIZE = 1000


class AisState:
    """Objects, their metadata, counters and the deny rule shared by the two ports."""

    def __init__(self, data_dir: Path, gcs_endpoint: str, deny: str) -> None:
        self.data_dir = data_dir
        self.gcs_endpoint = gcs_endpoint.rstrip("/")
        self.deny = deny
        self.page_size = PAGE_SIZE
        self.gateway_addr = ""
        self.target_addr = ""
        self.checksums: dict[str, tuple[int, int, str]] = {}  # path -> (mtime_ns, size, md5)
        self.versions: Counter[str] = Counter()
        self.fetch_locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.session: ClientSession | None = None
        self.reset()

    def reset(self) -> None:
        self.counts: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        self.cold_fetches = 0
        self.log: deque[dict[str, Any]] = deque(maxlen=100_000)

    def record(self, role: str, request: web.BaseRequest, status: int) -> None:
        """Count one answer (called as each response starts, so the status is final)."""
        self.counts[role][request.method][str(status)] += 1
        self.log.append({
            "role": role, "method": request.method, "path": request.path,
            "query": request.query_string, "range": request.headers.get("Range", ""),
            "status": status,
        })

    def stats(self) -> dict[str, Any]:
        return {
            "requests": {r: {m: dict(c) for m, c in ms.items()} for r, ms in self.counts.items()},
            "cold_fetches": self.cold_fetches,
            "log": list(self.log),
        }


def ais_error(request: web.BaseRequest, status: int, message: str) -> web.Response:
    """AIStore's error shape."""
    body = {"message": message, "method": request.method, "url_path": request.path,
            "remote_addr": request.remote or "", "caller": "", "node": "t[wdstest]",
            "status": status}
    return web.json_response(body, status=status)


def split_object(request: web.BaseRequest) -> tuple[str, str] | None:
    """``(bucket, object)`` of an object request, or None."""
    rest = request.path[len(_OBJECTS):]
    bucket, _, obj = rest.partition("/")
    if not bucket or not obj or ".." in obj.split("/"):
        return None
    return bucket, obj


def _md5_file(path: Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class AisHandlers:
    """The request handlers."""

    def __init__(self, state: AisState) -> None:
        self.s = state

    # -- gateway -------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def gateway_object(self, request: web.Request) -> web.StreamResponse:
        if "pid" in request.query:  # redirected to this port through a proxy: act as a target
            request["role"] = "target"
            return await self.target_object(request)
        denied = self._denied(request)
        if denied is not None:
            return denied
        host = request.headers.get("Host", "")
        base = f"http://{self.s.target_addr}" if host in ("", self.s.gateway_addr) else (
            f"http://{host}")
        sep = "&" if request.query_string else "?"
        pid = f"pid=wdstest{uuid.uuid4().hex[:8]}&utm={time.time_ns()}"
        status = 301 if request.method == "GET" else 307
        location = f"{base}{request.raw_path}{sep}{pid}"
        return web.Response(status=status, headers={"Location": location})

    def _denied(self, request: web.BaseRequest) -> web.Response | None:
        if self.s.deny and re.search(self.s.deny, unquote(request.raw_path.split("?", 1)[0])):
            return ais_error(request, 403, f"access denied: {request.path}")
        return None

    async def list_bucket(self, request: web.Request) -> web.Response:
        """AIStore's bucket listing (``GET /v1/buckets/<bucket>`` with a ``list`` action)."""
        bucket = unquote(request.match_info["bucket"])
        provider = PROVIDERS.get(request.query.get("provider", "ais"))
        try:
            msg = json.loads(await request.read() or b"{}")
        except ValueError:
            return self._fail(request, 400, "the body is not JSON")
        value = msg.get("value") if isinstance(msg, dict) else None
        if msg.get("action") != "list" or not isinstance(value, dict):
            return self._fail(request, 400, f"expected a 'list' action, got {msg!r}")
        prefix = str(value.get("prefix") or "")
        if self.s.deny and re.search(self.s.deny, f"{request.path}/{prefix}"):
            return ais_error(request, 403, f"access denied: {request.path} prefix {prefix!r}")
        if provider not in ("ais", "gcp") or (provider == "gcp" and not self.s.gcs_endpoint):
            return self._fail(request, 400, f"provider {provider!r} is not backed here")
        listed = (self._list_ais(bucket, prefix) if provider == "ais"
                  else await self._list_gcs(bucket, prefix))
        if listed is None:
            return self._fail(request, 404, f"bucket {provider}://{bucket} does not exist")
        token = str(value.get("continuation_token") or "")
        size = int(value.get("pagesize") or 0) or self.s.page_size
        rest = [entry for entry in listed if entry[0] > token]
        page, more = rest[:size], len(rest) > size
        return web.json_response({
            "uuid": uuid.uuid4().hex, "flags": 0,
            "entries": [{"name": name, "size": n} for name, n in page] or None,
            "continuation_token": page[-1][0] if more else "",
        })

    def _list_ais(self, bucket: str, prefix: str) -> list[tuple[str, int]] | None:
        root = self.s.data_dir / "ais" / bucket
        if not root.is_dir() or ".." in bucket.split("/"):
            return None
        found = []
        for path in root.rglob("*"):
            if path.is_file() and not (path.name.startswith(".") and path.name.endswith(".part")):
                name = path.relative_to(root).as_posix()
                if name.startswith(prefix):
                    found.append((name, path.stat().st_size))
        return sorted(found)

    async def _list_gcs(self, bucket: str, prefix: str) -> list[tuple[str, int]] | None:
        assert self.s.session is not None
        url = f"{self.s.gcs_endpoint}/storage/v1/b/{quote(bucket, safe='')}/o"
        found: list[tuple[str, int]] = []
        token = ""
        while True:
            query = {"prefix": prefix, **({"pageToken": token} if token else {})}
            async with self.s.session.get(url, params=query) as resp:
                if resp.status == 404:
                    return None
                if resp.status != 200:
                    raise web.HTTPBadGateway(text=f"fake-gcs answered {resp.status} for {url}")
                body = await resp.json()
            found += [(item["name"], int(item.get("size", 0))) for item in body.get("items", [])]
            token = body.get("nextPageToken") or ""
            if not token:
                return sorted(found)

    # -- target --------------------------------------------------------------------------------
    async def target_object(self, request: web.Request) -> web.StreamResponse:
        denied = self._denied(request)
        if denied is not None:
            return denied
        parsed = split_object(request)
        provider = PROVIDERS.get(request.query.get("provider", "ais"))
        if parsed is None or provider is None:
            return self._fail(request, 400, "bad object path or provider")
        if provider not in ("ais", "gcp") or (provider == "gcp" and not self.s.gcs_endpoint):
            return self._fail(request, 400, f"provider {provider!r} is not backed here")
        bucket, obj = parsed
        path = self.s.data_dir / provider / bucket / obj
        if request.method == "PUT":
            return await self._put(request, provider, bucket, obj, path)
        if not path.is_file() and provider == "gcp":
            await self._cold_fetch(bucket, obj, path)
        if not path.is_file():
            return self._fail(request, 404, f"{provider}://{bucket}/{obj} does not exist")
        return self._serve(request, path)

    def _fail(self, request: web.BaseRequest, status: int, message: str) -> web.Response:
        return ais_error(request, status, message)

    def _serve(self, request: web.Request, path: Path) -> web.StreamResponse:
        st = path.stat()
        known = self.s.checksums.get(str(path))
        if known is None or known[:2] != (st.st_mtime_ns, st.st_size):
            known = (st.st_mtime_ns, st.st_size, _md5_file(path))
            self.s.checksums[str(path)] = known
        headers = {
            "Ais-Checksum-Type": "md5", "Ais-Checksum-Value": known[2],
            "Ais-Atime": str(time.time_ns()),
            "Ais-Version": str(max(1, self.s.versions[str(path)])),
        }
        if request.method == "HEAD":
            headers["Ais-Present"] = "true"
        return web.FileResponse(path, headers=headers)

    async def _cold_fetch(self, bucket: str, obj: str, path: Path) -> None:
        """Copy gs://bucket/obj from fake-gcs into the cache (nothing if it does not exist)."""
        async with self.s.fetch_locks[str(path)]:
            if path.is_file():
                return
            assert self.s.session is not None
            url = (f"{self.s.gcs_endpoint}/download/storage/v1/b/{quote(bucket, safe='')}/o/"
                   f"{quote(obj, safe='')}?alt=media")
            async with self.s.session.get(url) as resp:
                if resp.status == 404:
                    return
                if resp.status != 200:
                    raise web.HTTPBadGateway(text=f"fake-gcs answered {resp.status} for {url}")
                self.s.cold_fetches += 1
                await self._store(resp.content, path)

    async def _store(self, stream: Any, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
        digest = hashlib.md5()
        with open(tmp, "wb") as f:
            async for chunk in stream.iter_chunked(1 << 20):
                digest.update(chunk)
                f.write(chunk)
        os.replace(tmp, path)
        st = path.stat()
        self.s.checksums[str(path)] = (st.st_mtime_ns, st.st_size, digest.hexdigest())
        self.s.versions[str(path)] += 1

    async def _put(self, request: web.Request, provider: str, bucket: str, obj: str,
                   path: Path) -> web.Response:
        await self._store(request.content, path)
        if provider == "gcp":
            assert self.s.session is not None
            url = (f"{self.s.gcs_endpoint}/upload/storage/v1/b/{quote(bucket, safe='')}/o"
                   f"?uploadType=media&name={quote(obj, safe='')}")
            with open(path, "rb") as f:
                async with self.s.session.post(
                        url, data=f, headers={"Content-Type": "application/octet-stream"}) as resp:
                    if resp.status != 200:
                        path.unlink(missing_ok=True)
                        return self._fail(request, 502, f"fake-gcs answered {resp.status}")
        return web.Response(status=200)

    # -- test control --------------------------------------------------------------------------
    async def get_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.s.stats())

    async def post_reset(self, request: web.Request) -> web.Response:
        self.s.reset()
        return web.json_response({})

    async def post_evict(self, request: web.Request) -> web.Response:
        shutil.rmtree(self.s.data_dir / "gcp", ignore_errors=True)
        return web.json_response({})

    async def post_config(self, request: web.Request) -> web.Response:
        body = await request.json()
        if set(body) - {"deny", "page_size"}:
            return web.json_response({"error": "only 'deny' and 'page_size' can be set"},
                                     status=400)
        if "page_size" in body:
            if not isinstance(body["page_size"], int) or body["page_size"] < 1:
                return web.json_response({"error": "page_size must be an int >= 1"}, status=400)
            self.s.page_size = body["page_size"]
        if "deny" in body:
            deny = str(body.get("deny") or "")
            try:
                re.compile(deny)
            except re.error as exc:
                return web.json_response({"error": str(exc)}, status=400)
            self.s.deny = deny
        return web.json_response({"deny": self.s.deny, "page_size": self.s.page_size})


def build_apps(server: AisHandlers) -> tuple[web.Application, web.Application]:
    gateway = web.Application(client_max_size=1 << 30)
    gateway.router.add_get("/v1/health", server.health)
    gateway.router.add_get("/__ais__/stats", server.get_stats)
    gateway.router.add_post("/__ais__/reset", server.post_reset)
    gateway.router.add_post("/__ais__/evict", server.post_evict)
    gateway.router.add_post("/__ais__/config", server.post_config)
    gateway.router.add_get(_BUCKETS + "{bucket}", server.list_bucket)
    target = web.Application(client_max_size=1 << 30)
    for method in ("GET", "HEAD", "PUT"):
        gateway.router.add_route(method, _OBJECTS + "{tail:.+}", server.gateway_object)
        target.router.add_route(method, _OBJECTS + "{tail:.+}", server.target_object)
    for app, role in ((gateway, "gateway"), (target, "target")):

        async def record(request: web.Request, response: web.StreamResponse,
                         role: str = role) -> None:
            if not request.path.startswith("/__ais__/"):
                server.s.record(request.get("role", role), request, response.status)

        app.on_response_prepare.append(record)
    return gateway, target


async def serve(args: argparse.Namespace) -> None:
    state = AisState(Path(args.data_dir), args.gcs_endpoint, args.deny)
    state.session = ClientSession(timeout=ClientTimeout(total=None, sock_connect=10))
    gateway, target = build_apps(AisHandlers(state))
    runners = []
    ports = []
    for app, port in ((gateway, args.gateway_port), (target, args.target_port)):
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, args.host, port, shutdown_timeout=0.5).start()
        runners.append(runner)
        ports.append(runner.addresses[0][1])
    state.gateway_addr, state.target_addr = (f"{args.host}:{p}" for p in ports)
    log.info("AIS gateway on %s, target on %s", state.gateway_addr, state.target_addr)
    if args.ready_file:
        tmp = args.ready_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"gateway_port": ports[0], "target_port": ports[1], "pid": os.getpid()}, f)
        os.replace(tmp, args.ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for runner in runners:
        await runner.cleanup()
    await state.session.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--gcs-endpoint", default="", help="fake-gcs base URL for provider=gcp")
    parser.add_argument("--deny", default="", help="regex of paths answered 403")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--gateway-port", type=int, default=0)
    parser.add_argument("--target-port", type=int, default=0)
    parser.add_argument("--ready-file", default="")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
