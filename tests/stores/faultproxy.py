"""A fault-injecting HTTP reverse proxy (aiohttp), run as its own process in front of one upstream.

    python tests/stores/faultproxy.py --upstream http://127.0.0.1:9000 [--port 0]
        [--ready-file F] [--flavor s3|gcs|azure|ais|plain] [--seed 0] [--config JSON]

It forwards method, raw path and query, headers (the client's ``Host`` too: S3 SigV4 signs it)
and body, and streams response bodies through without buffering them; connections are kept
alive on both sides. Faults (all off by default; start values from ``--config``, changed at run
time with ``POST /__fault__/config``; decisions come from one ``random.Random(seed)``):

=================  ====================================================================
``cut_every``      abort the connection after about N body bytes of a response (±20 %)
``cut_mode``       ``"reset"`` (RST, the default) or ``"close"`` (FIN) for those cuts
``error_rate``     answer ``error_status`` (503 or 429, ...) to this fraction of requests
``error_ranged``   answer ``error_status`` to this fraction of requests with a ``Range``
                   header (resumes), on top of ``error_rate``
``error_status``   503 by default; 429 carries ``Retry-After: retry_after`` (default 0)
``stall``          seconds to pause once mid-body, in ``stall_rate`` of responses (default all)
``truncate``       fraction of responses that end early (at 10-90 %) with a clean close,
                   after a correct ``Content-Length`` was sent
``latency``        seconds before every response starts
``deny``           regex searched in the decoded path and query: matches get 403
``only_paths``     regex (path and query): the faults above (not ``deny``) apply only to
                   matching requests
``only_methods``   list of methods the faults apply to (empty: all)
``rate``           bytes per second for the response bodies of all connections together
                   (a shaped link: one token bucket shared by every response, bursts of
                   at most :data:`_BURST` bytes; 0, the default: no limit); not a fault,
                   so ``only_paths`` and ``only_methods`` do not narrow it
``conn_rate``      bytes per second for each response body on its own (a store whose
                   single connection is slower than the link, as S3's is); with ``rate``,
                   both limits hold
=================  ====================================================================

Control: ``GET /__fault__/config``, ``POST /__fault__/config`` (JSON object, merged),
``GET /__fault__/stats``, ``POST /__fault__/reset`` (stats cleared, faults back to the start
values, random generator re-seeded). Error bodies look like the upstream's (``--flavor``) so that
SDKs classify them as they would a real answer.

When ``--ready-file`` is given, ``{"port": N, "pid": P}`` is written to it once listening.
Only the standard library and aiohttp are imported, so the file runs as a plain script.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import re
import signal
import socket
import struct
import sys
from collections import Counter, defaultdict, deque
from typing import Any, NoReturn
from urllib.parse import unquote

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web
from yarl import URL

log = logging.getLogger("faultproxy")

DEFAULTS: dict[str, Any] = {
    "cut_every": 0,
    "cut_mode": "reset",
    "error_rate": 0.0,
    "error_ranged": 0.0,
    "error_status": 503,
    "retry_after": 0,
    "stall": 0.0,
    "stall_rate": 1.0,
    "truncate": 0.0,
    "latency": 0.0,
    "deny": "",
    "only_paths": "",
    "only_methods": [],
    "rate": 0,
    "conn_rate": 0,
    "seed": 0,
}
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "trailers", "transfer-encoding", "upgrade", "expect",
})
_CHUNK = 1 << 20
_LOG_LIMIT = 100_000
_BURST = 256 << 10  # a shaped link sends at most this much at once, in pieces of this size


def check_config(changes: dict[str, Any]) -> dict[str, Any]:
    """Validate a config change; raises ValueError naming the bad key."""
    out: dict[str, Any] = {}
    for key, value in changes.items():
        if key not in DEFAULTS:
            raise ValueError(f"unknown fault {key!r}; known: {', '.join(sorted(DEFAULTS))}")
        default = DEFAULTS[key]
        if key in ("deny", "only_paths"):
            value = str(value or "")
            re.compile(value)
        elif key == "cut_mode":
            if value not in ("reset", "close"):
                raise ValueError("cut_mode must be 'reset' or 'close'")
        elif key == "only_methods":
            value = [str(m).upper() for m in (value or [])]
        elif isinstance(default, float):
            value = float(value)
        elif isinstance(default, int):
            value = int(value)
        if (key.endswith("_rate") and key != "conn_rate") or key == "truncate":  # fractions
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{key} must be between 0 and 1, got {value}")
        elif isinstance(value, (int, float)) and value < 0:
            raise ValueError(f"{key} must not be negative, got {value}")
        out[key] = value
    return out


def _path(request: web.BaseRequest) -> str:
    """Path and query with every escape decoded (gcsfs sends object names as a%2Fb, and
    listings as ?prefix=a/b): what ``deny`` and ``only_paths`` are searched in."""
    return unquote(request.raw_path)


class Stats:
    """What the proxy did; ``as_dict`` is what ``GET /__fault__/stats`` returns."""

    def __init__(self) -> None:
        self.by_method: dict[str, Counter[str]] = defaultdict(Counter)
        self.faults: Counter[str] = Counter()
        self.bytes_sent = 0
        self.client_disconnects = 0
        self.requests: deque[dict[str, Any]] = deque(maxlen=_LOG_LIMIT)

    def record(self, request: web.BaseRequest, status: int, fault: str = "") -> dict[str, Any]:
        self.by_method[request.method][str(status)] += 1
        if fault:
            self.faults[fault] += 1
        entry = {
            "method": request.method, "path": request.raw_path.split("?", 1)[0],
            "query": request.query_string,
            "range": request.headers.get("Range") or request.headers.get("x-ms-range", ""),
            "status": status, "bytes": 0, "fault": fault,
        }
        self.requests.append(entry)
        return entry

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": {m: dict(c) for m, c in self.by_method.items()},
            "total": sum(sum(c.values()) for c in self.by_method.values()),
            "bytes_sent": self.bytes_sent,
            "faults": dict(self.faults),
            "client_disconnects": self.client_disconnects,
            "log": list(self.requests),
        }


def error_body(flavor: str, status: int, message: str) -> tuple[bytes, str, dict[str, str]]:
    """An error answer shaped like the upstream's: (body, content type, extra headers)."""
    if flavor == "s3":
        code = {403: "AccessDenied", 404: "NoSuchKey", 429: "SlowDown", 503: "SlowDown"}.get(
            status, "InternalError")
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>{message}</Message><RequestId>faultproxy</RequestId></Error>")
        return body.encode(), "application/xml", {}
    if flavor == "azure":
        code = {403: "AuthorizationFailure", 429: "ServerBusy", 503: "ServerBusy"}.get(
            status, "InternalError")
        body = (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code>'
                f"<Message>{message}</Message></Error>")
        return body.encode(), "application/xml", {"x-ms-error-code": code}
    if flavor == "gcs":
        data = {"error": {"code": status, "message": message,
                          "errors": [{"message": message, "reason": "faultproxy"}]}}
        return json.dumps(data).encode(), "application/json", {}
    if flavor == "ais":
        return json.dumps({"message": message, "status": status}).encode(), "application/json", {}
    return message.encode(), "text/plain", {}


class Link:
    """A link of ``rate`` bytes per second shared by every response (a token bucket, kept as
    the time at which the bytes already granted will have gone out): a sender waits until
    its bytes fit, and senders are served in the order they asked."""

    def __init__(self) -> None:
        self._free_at = 0.0  # when the bytes granted so far are sent, at ``rate``

    async def send(self, nbytes: int, rate: int) -> None:
        now = asyncio.get_running_loop().time()
        self._free_at = max(self._free_at, now) + nbytes / rate
        ahead = self._free_at - now - _BURST / rate  # a burst may go out at once
        if ahead > 0:
            await asyncio.sleep(ahead)


class FaultProxyApp:
    """The proxy's state and handlers."""

    def __init__(self, upstream: str, *, flavor: str, start_config: dict[str, Any]) -> None:
        self.upstream = upstream.rstrip("/")
        self.flavor = flavor
        self.start_config = {**DEFAULTS, **check_config(start_config)}
        self.config = dict(self.start_config)
        self.rng = random.Random(self.config["seed"])
        self.stats = Stats()
        self.link = Link()
        self.session: ClientSession | None = None

    # -- control -------------------------------------------------------------------------------
    async def get_config(self, request: web.Request) -> web.Response:
        return web.json_response(self.config)

    async def post_config(self, request: web.Request) -> web.Response:
        try:
            changes = check_config(dict(await request.json()))
        except (ValueError, TypeError, re.error) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        self.config.update(changes)
        if "seed" in changes:
            self.rng.seed(changes["seed"])
        log.info("config %s", changes)
        return web.json_response(self.config)

    async def get_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats.as_dict())

    async def post_reset(self, request: web.Request) -> web.Response:
        self.config = dict(self.start_config)
        self.rng.seed(self.config["seed"])
        self.stats = Stats()
        self.link = Link()
        return web.json_response(self.config)

    # -- forwarding ----------------------------------------------------------------------------
    def _in_scope(self, request: web.BaseRequest) -> bool:
        methods = self.config["only_methods"]
        if methods and request.method not in methods:
            return False
        pattern = self.config["only_paths"]
        return not pattern or re.search(pattern, _path(request)) is not None

    def _answer(self, request: web.BaseRequest, status: int, message: str,
                fault: str) -> web.Response:
        body, ctype, extra = error_body(self.flavor, status, message)
        if status == 429:
            extra["Retry-After"] = str(self.config["retry_after"])
        entry = self.stats.record(request, status, fault)
        entry["bytes"] = 0 if request.method == "HEAD" else len(body)
        self.stats.bytes_sent += entry["bytes"]
        return web.Response(status=status, body=body, content_type=ctype, headers=extra)

    async def forward(self, request: web.Request) -> web.StreamResponse:
        deny = self.config["deny"]
        if deny and re.search(deny, _path(request)):
            return self._answer(request, 403, "Access denied by faultproxy", "deny")
        scoped = self._in_scope(request)
        if scoped and self.config["latency"] > 0:
            self.stats.faults["latency"] += 1
            await asyncio.sleep(self.config["latency"])
        rate = self.config["error_rate"]
        if "Range" in request.headers:
            rate = max(rate, self.config["error_ranged"])
        if scoped and rate > 0 and self.rng.random() < rate:
            status = self.config["error_status"]
            return self._answer(request, status, f"injected {status} by faultproxy", "error")
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
        data = request.content if request.body_exists else None
        url = URL(self.upstream + request.raw_path, encoded=True)
        assert self.session is not None
        try:
            async with self.session.request(request.method, url, headers=headers, data=data,
                                            allow_redirects=False) as upstream:
                return await self._relay(request, upstream, scoped)
        except ConnectionResetError as exc:  # the client went away (read timeout, close)
            self.stats.client_disconnects += 1
            log.debug("client gone during %s %s: %s", request.method, request.path, exc)
            raise asyncio.CancelledError from exc
        except ClientError as exc:  # the upstream failed
            if not request.get("prepared"):
                return self._answer(request, 502, f"upstream failed: {exc}", "")
            log.warning("upstream failed mid-body for %s: %s", request.path, exc)
            self._cut(request, "reset")  # pass the broken body on as it is

    async def _relay(self, request: web.Request, upstream: Any,
                     scoped: bool) -> web.StreamResponse:
        resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for key, value in upstream.headers.items():
            if key.lower() not in _HOP_BY_HOP:
                resp.headers.add(key, value)
        length = upstream.content_length
        plan = self._plan(length) if scoped and request.method != "HEAD" else {}
        entry = self.stats.record(request, upstream.status, plan.get("kind", ""))
        await resp.prepare(request)
        request["prepared"] = True
        if request.method == "HEAD" or upstream.status in (204, 304):
            await resp.write_eof()
            return resp
        sent, own = 0, Link()  # own: this response's share when ``conn_rate`` is set
        stop_at = plan.get("stop_at")
        stall_at = plan.get("stall_at")
        async for chunk in upstream.content.iter_chunked(_CHUNK):
            if stall_at is not None and sent + len(chunk) >= stall_at:
                head, chunk = chunk[: stall_at - sent], chunk[stall_at - sent:]
                sent += await self._write(resp, head, entry, own)
                stall_at = None
                await asyncio.sleep(self.config["stall"])
            if stop_at is not None and sent + len(chunk) >= stop_at:
                sent += await self._write(resp, chunk[: stop_at - sent], entry, own)
                self._cut(request, plan["mode"])
            sent += await self._write(resp, chunk, entry, own)
        await resp.write_eof()
        return resp

    def _plan(self, length: int | None) -> dict[str, Any]:
        """Which body fault this response gets, and where."""
        cfg, rng = self.config, self.rng
        if cfg["truncate"] > 0 and length and length > 1 and rng.random() < cfg["truncate"]:
            return {"kind": "truncate", "stop_at": max(1, int(length * rng.uniform(0.1, 0.9))),
                    "mode": "close"}
        if cfg["stall"] > 0 and rng.random() < cfg["stall_rate"]:
            where = int((length or _CHUNK) * rng.uniform(0.1, 0.9))
            return {"kind": "stall", "stall_at": max(1, where)}
        if cfg["cut_every"] > 0:
            at = max(1, int(cfg["cut_every"] * rng.uniform(0.8, 1.2)))
            if length is None or at < length:
                return {"kind": "cut", "stop_at": at, "mode": cfg["cut_mode"]}
        return {}

    async def _write(self, resp: web.StreamResponse, data: bytes, entry: dict[str, Any],
                     own: Link) -> int:
        """Send ``data`` (through the shaped link when ``rate`` is set, and at most
        ``conn_rate`` for this response, ``own``)."""
        rate, own_rate = self.config["rate"], self.config["conn_rate"]
        step = _BURST if rate or own_rate else max(1, len(data))
        view = memoryview(data)  # pieces without copies (``data`` is bytes: immutable)
        for at in range(0, len(view), step):
            piece = view[at:at + step]
            if rate:
                await self.link.send(len(piece), rate)
            if own_rate:
                await own.send(len(piece), own_rate)
            await resp.write(piece)
            entry["bytes"] += len(piece)
            self.stats.bytes_sent += len(piece)
        return len(data)

    @staticmethod
    def _cut(request: web.Request, mode: str) -> NoReturn:
        """Drop the client's connection (RST or FIN) and end the handler."""
        transport = request.transport
        if transport is None:
            raise asyncio.CancelledError
        if mode == "reset":
            sock = transport.get_extra_info("socket")
            if sock is not None:  # linger 0: close() sends RST instead of FIN
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        else:  # close() sends what is buffered, then FIN
            transport.close()
        # the handler's end: aiohttp must not try to finish a response on a dead connection
        raise asyncio.CancelledError


def build_app(proxy: FaultProxyApp) -> web.Application:
    app = web.Application(client_max_size=1 << 30)
    app.router.add_get("/__fault__/config", proxy.get_config)
    app.router.add_post("/__fault__/config", proxy.post_config)
    app.router.add_get("/__fault__/stats", proxy.get_stats)
    app.router.add_post("/__fault__/reset", proxy.post_reset)
    app.router.add_route("*", "/{tail:.*}", proxy.forward)

    async def session_ctx(app: web.Application) -> Any:
        proxy.session = ClientSession(
            connector=TCPConnector(limit=0, enable_cleanup_closed=True),
            auto_decompress=False, skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent",
                                                      "Content-Type"),
            timeout=ClientTimeout(total=None, sock_connect=10), read_bufsize=1 << 20,
        )
        yield
        await proxy.session.close()

    app.cleanup_ctx.append(session_ctx)
    return app


async def serve(args: argparse.Namespace) -> None:
    config = json.loads(args.config) if args.config else {}
    proxy = FaultProxyApp(args.upstream, flavor=args.flavor, start_config={**config,
                                                                            "seed": args.seed})
    runner = web.AppRunner(build_app(proxy), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, shutdown_timeout=0.5)
    await site.start()
    port = runner.addresses[0][1]
    log.info("faultproxy on %s:%d -> %s", args.host, port, args.upstream)
    if args.ready_file:
        tmp = args.ready_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"port": port, "pid": os.getpid()}, f)
        os.replace(tmp, args.ready_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://127.0.0.1:9000")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file", default="")
    parser.add_argument("--flavor", default="plain", choices=["s3", "gcs", "azure", "ais",
                                                               "plain"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", default="", help="JSON object of start faults")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
