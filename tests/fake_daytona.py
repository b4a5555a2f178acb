"""A fake Daytona control plane and toolbox, backed by local Docker containers.

The real ``daytona`` SDK drives it unchanged: routes, status codes and DTO fields are
the ones the SDK's generated clients expect (checked against ``daytona`` 0.226), so a
test that passes here exercises the same requests a real Daytona would receive. Only
the runner is replaced: a sandbox is a container, a volume is a host folder
bind-mounted at its mount path, a snapshot is a committed image.

Faults a test can inject (attributes of :class:`FakeDaytona`):

* ``creating_delay`` — seconds a new or starting sandbox stays ``creating``/``starting``;
* ``fail(pattern, status, times)`` — the next matching requests answer ``status``
  (429 and 502 included);
* ``auto_stop(sandbox_id)`` — what Daytona does when the idle timer fires; the timer
  itself runs too, counting only API and toolbox requests as activity (as Daytona
  does), with ``seconds_per_minute`` to make its minutes short in tests;
* ``last_activity[sandbox_id]`` — when the API last saw activity (refresh_activity).

Preview links (``GET /sandbox/{id}/ports/{port}/preview-url``) are served by
:class:`~.fake_daytona_preview.PreviewProxy` (``preview``), which needs the sandbox's
token as Daytona's proxy does.

Socket.IO is answered with 404, so the SDK falls back to polling sandbox state.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import shutil
import socket
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http import HTTPStatus
from pathlib import Path
from typing import Any

import docker
from aiohttp import WSMsgType, web

from .fake_daytona_preview import PreviewProxy

API_KEY = "fake-daytona-key"
FAKE_LABEL = "fake-daytona"
ORG = "org-fake"
SANDBOX_UID = "1000:1000"
HOME = "/home/daytona"
PTY_SUBPROTOCOL = "X-Daytona-Pty-Exit-Control"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def _error(status: int, message: str) -> web.Response:
    return web.json_response(
        {
            "statusCode": status,
            "message": message,
            "error": HTTPStatus(status).phrase,
            "code": None,
        },
        status=status,
    )


class _IterReader(io.RawIOBase):
    """A file-like view of an iterator of bytes, for tarfile's streaming mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            try:
                self._buf = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


@dataclass
class FakeSandbox:
    id: str
    name: str
    snapshot: str
    image: str
    labels: dict[str, str]
    env: dict[str, str]
    volumes: list[dict[str, Any]]
    cpu: int = 1
    memory: int = 1
    disk: int = 3
    state: str = "creating"
    auto_stop: int = 15
    auto_delete: int = -1
    auto_archive: int = 10080
    network_block_all: bool = False
    # Kept and shown as Daytona does; not enforced here (the fake's containers are
    # on Docker's bridge or on no network).
    network_allow_list: str | None = None
    domain_allow_list: str | None = None
    container_id: str = ""
    created_at: str = field(default_factory=_now)
    updated_at: str = field(default_factory=_now)
    error_reason: str | None = None
    ready_at: float = 0.0
    auth_token: str = field(default_factory=lambda: uuid.uuid4().hex)  # its preview token


@dataclass
class FakeSnapshot:
    id: str
    name: str
    image: str
    general: bool
    source: str | None = None
    size: float | None = None
    state: str = "active"
    created_at: str = field(default_factory=_now)


class FakeDaytona:
    """The server; :meth:`start` runs it on a thread and returns its API URL."""

    def __init__(self, root: Path, base_images: dict[str, str]) -> None:
        self.root = Path(root)
        self.docker = docker.from_env()
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.volumes: dict[str, dict[str, Any]] = {}
        self.snapshots: dict[str, FakeSnapshot] = {}
        self.last_activity: dict[str, float] = {}
        self.creating_delay = 0.0
        self.seconds_per_minute = 60.0
        self.requests: list[tuple[str, str]] = []
        self.preview = PreviewProxy(self._address, self._preview_token)
        self._faults: list[list[Any]] = []
        self._ptys: dict[tuple[str, str], str] = {}  # (sandbox, pty id) -> exec id
        # (sandbox, pty id) -> PtySessionInfo as the daemon reports it (size, cwd, envs)
        self.pty_info: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.url = ""
        # Its containers carry this: close() removes its own, never another fake's (another
        # pytest-xdist worker runs one at the same time on the same engine).
        self.instance = uuid.uuid4().hex
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        for name, image in base_images.items():
            self.snapshots[name] = FakeSnapshot(
                id=uuid.uuid4().hex, name=name, image=image, general=True
            )

    # -- fault injection ------------------------------------------------------------
    def fail(self, pattern: str, status: int, times: int = 1, message: str = "") -> None:
        """The next ``times`` requests whose "METHOD path" matches ``pattern`` get ``status``."""
        with self._lock:
            self._faults.append([re.compile(pattern), status, times, message])

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _fault_for(self, method: str, path: str) -> web.Response | None:
        with self._lock:
            for fault in self._faults:
                pattern, status, times, message = fault
                if times > 0 and pattern.search(f"{method} {path}"):
                    fault[2] -= 1
                    text = message or {429: "Too many requests", 502: "Bad gateway"}.get(
                        status, "injected"
                    )
                    return _error(status, text)
        return None

    def auto_stop(self, sandbox_id: str) -> None:
        """Stop a sandbox the way Daytona's idle timer does."""
        box = self.sandboxes[sandbox_id]
        self.docker.containers.get(box.container_id).stop(timeout=1)
        box.state, box.updated_at = "stopped", _now()

    def archive(self, sandbox_id: str) -> None:
        """Move a stopped sandbox to object storage, as Daytona does after a week."""
        self.auto_stop(sandbox_id)
        self.sandboxes[sandbox_id].state = "archived"

    # -- server ------------------------------------------------------------------
    def start(self) -> str:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            app = self._app()
            self._runner = web.AppRunner(app)
            loop.run_until_complete(self._runner.setup())
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            site = web.SockSite(self._runner, sock)
            loop.run_until_complete(site.start())
            self.url = f"http://127.0.0.1:{sock.getsockname()[1]}/api"
            ready.set()
            loop.run_forever()

        threading.Thread(target=run, daemon=True, name="fake-daytona").start()
        threading.Thread(target=self._idle_timer, daemon=True, name="fake-daytona-autostop").start()
        ready.wait(10)
        return self.url

    def _idle_timer(self) -> None:
        while True:
            time.sleep(0.25)
            for box in list(self.sandboxes.values()):
                if box.state != "started" or not box.auto_stop or not box.container_id:
                    continue
                idle = time.time() - self.last_activity.get(box.id, time.time())
                if idle > box.auto_stop * self.seconds_per_minute:
                    try:
                        self.auto_stop(box.id)
                    except docker.errors.NotFound:
                        pass

    def close(self) -> None:
        for container in self.docker.containers.list(
            ignore_removed=True, all=True, filters={"label": f"{FAKE_LABEL}={self.instance}"}
        ):
            container.remove(force=True)
        for snap in self.snapshots.values():
            if not snap.general:
                try:
                    self.docker.images.remove(snap.image, force=True)
                except docker.errors.ImageNotFound:
                    pass
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self.preview.close(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)

    @property
    def toolbox_url(self) -> str:
        return self.url.rsplit("/api", 1)[0] + "/toolbox"

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=1 << 31)
        r = app.router
        r.add_route("*", "/socket.io/{tail:.*}", self._no_socketio)
        r.add_route("*", "/api/socket.io/{tail:.*}", self._no_socketio)
        r.add_post("/api/sandbox", self.create_sandbox)
        r.add_get("/api/sandbox", self.list_sandboxes)
        r.add_get("/api/sandbox/{id}", self.get_sandbox)
        r.add_delete("/api/sandbox/{id}", self.delete_sandbox)
        r.add_post("/api/sandbox/{id}/start", self.start_sandbox)
        r.add_post("/api/sandbox/{id}/stop", self.stop_sandbox)
        r.add_put("/api/sandbox/{id}/labels", self.replace_labels)
        r.add_post("/api/sandbox/{id}/autostop/{n}", self.set_interval)
        r.add_post("/api/sandbox/{id}/autodelete/{n}", self.set_interval)
        r.add_post("/api/sandbox/{id}/autoarchive/{n}", self.set_interval)
        r.add_post("/api/sandbox/{id}/last-activity", self.update_activity)
        r.add_post("/api/sandbox/{id}/snapshot", self.snapshot_sandbox)
        r.add_get("/api/sandbox/{id}/toolbox-proxy-url", self.toolbox_proxy_url)
        r.add_get("/api/sandbox/{id}/ports/{port}/preview-url", self.preview_url)
        r.add_get("/api/volumes", self.list_volumes)
        r.add_post("/api/volumes", self.create_volume)
        r.add_get("/api/volumes/by-name/{name}", self.get_volume_by_name)
        r.add_get("/api/volumes/{id}", self.get_volume)
        r.add_delete("/api/volumes/{id}", self.delete_volume)
        r.add_get("/api/snapshots", self.list_snapshots)
        r.add_get("/api/snapshots/{id}", self.get_snapshot)
        r.add_delete("/api/snapshots/{id}", self.delete_snapshot)
        t = "/toolbox/{sid}"
        r.add_get(t + "/system/metrics", self.system_metrics)
        r.add_post(t + "/process/execute", self.execute)
        r.add_get(t + "/process/pty/create-connect", self.pty_create_connect)
        r.add_delete(t + "/process/pty/{pty}", self.pty_delete)
        r.add_get(t + "/process/pty", self.pty_list)
        r.add_get(t + "/process/pty/{pty}", self.pty_get)
        r.add_post(t + "/process/pty/{pty}/resize", self.pty_resize)
        r.add_get(t + "/files", self.list_files)
        r.add_delete(t + "/files", self.delete_file)
        r.add_post(t + "/files/folder", self.create_folder)
        r.add_get(t + "/files/info", self.file_info)
        r.add_post(t + "/files/bulk-upload", self.bulk_upload)
        r.add_post(t + "/files/bulk-download", self.bulk_download)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if "socket.io" in request.path:
            return await handler(request)
        if request.headers.get("Authorization") != f"Bearer {API_KEY}":
            return _error(401, "Invalid API key")
        fault = self._fault_for(request.method, request.path)
        if fault is not None:
            return fault
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except KeyError as exc:
            return _error(404, f"Not found: {exc}")
        finally:
            # A toolbox request is activity until it is answered: the idle timer never
            # stops a sandbox under a command that is still running.
            box = self.sandboxes.get(request.match_info.get("sid", ""))
            if box is not None:
                self.last_activity[box.id] = time.time()

    async def _no_socketio(self, request: web.Request) -> web.Response:
        return web.Response(status=404, text="no socket.io here")

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    # -- control plane: sandboxes -------------------------------------------------------
    def _find(self, id_or_name: str) -> FakeSandbox:
        box = self.sandboxes.get(id_or_name)
        if box is None:
            box = next((b for b in self.sandboxes.values() if b.name == id_or_name), None)
        if box is None or box.state == "destroyed":
            raise web.HTTPNotFound(
                text=json.dumps(
                    {
                        "statusCode": 404,
                        "message": f"Sandbox with ID or name {id_or_name} not found",
                    }
                ),
                content_type="application/json",
            )
        return box

    def _state(self, box: FakeSandbox) -> str:
        if box.state in ("creating", "starting") and time.monotonic() >= box.ready_at:
            box.state = "started"
        if box.state == "started" and box.container_id:
            try:
                status = self.docker.containers.get(box.container_id).status
            except docker.errors.NotFound:
                box.state, box.error_reason = "error", "the runner lost the sandbox"
            else:
                if status != "running":
                    box.state = "stopped"
        return box.state

    def _dto(self, box: FakeSandbox) -> dict[str, Any]:
        return {
            "id": box.id,
            "organizationId": ORG,
            "name": box.name,
            "snapshot": box.snapshot,
            "user": "daytona",
            "env": box.env,
            "labels": box.labels,
            "public": False,
            "networkBlockAll": box.network_block_all,
            "networkAllowList": box.network_allow_list,
            "domainAllowList": box.domain_allow_list,
            "kvm": False,
            "target": "us",
            "cpu": box.cpu,
            "gpu": 0,
            "memory": box.memory,
            "disk": box.disk,
            "state": self._state(box),
            "errorReason": box.error_reason,
            "recoverable": False,
            "autoStopInterval": box.auto_stop,
            "autoArchiveInterval": box.auto_archive,
            "autoDeleteInterval": box.auto_delete,
            "volumes": box.volumes,
            "createdAt": box.created_at,
            "updatedAt": box.updated_at,
            "lastActivityAt": datetime.fromtimestamp(
                self.last_activity.get(box.id, time.time()), timezone.utc
            ).isoformat(),
            "toolboxProxyUrl": self.toolbox_url,
        }

    async def create_sandbox(self, request: web.Request) -> web.Response:
        body = await request.json()
        snapshot_name = body.get("snapshot") or next(
            n for n, s in self.snapshots.items() if s.general
        )
        snap = self.snapshots.get(snapshot_name) or next(
            (s for s in self.snapshots.values() if s.id == snapshot_name), None
        )
        if snap is None:
            return _error(
                400,
                f"Snapshot {snapshot_name} not found. Did you add it through the Daytona Dashboard?",
            )
        if body.get("name") and any(
            b.name == body["name"] and b.state != "destroyed" for b in self.sandboxes.values()
        ):
            return _error(409, f"Sandbox with name {body['name']} already exists")
        for mount in body.get("volumes") or []:
            vol = self.volumes.get(mount["volumeId"])
            if vol is None or vol["state"] != "ready":
                return _error(400, f"Volume {mount['volumeId']} is not in a ready state")
        box = FakeSandbox(
            id=str(uuid.uuid4()),
            name=body.get("name") or "",
            snapshot=snap.name,
            image=snap.image,
            labels=body.get("labels") or {},
            env=body.get("env") or {},
            volumes=body.get("volumes") or [],
            network_block_all=bool(body.get("networkBlockAll")),
            network_allow_list=body.get("networkAllowList"),
            domain_allow_list=body.get("domainAllowList"),
        )
        box.name = box.name or box.id
        if body.get("autoStopInterval") is not None:
            box.auto_stop = body["autoStopInterval"]
        if body.get("autoDeleteInterval") is not None:
            box.auto_delete = body["autoDeleteInterval"]
        # The name is taken at once (no await since the check above), as Daytona's unique
        # index does: of two concurrent creates with one name, the second gets 409.
        box.ready_at = float("inf")  # creating until its container exists
        self.sandboxes[box.id] = box
        self.last_activity[box.id] = time.time()
        try:
            await self._run(self._create_container, box)
        except Exception:
            del self.sandboxes[box.id]
            raise
        box.ready_at = time.monotonic() + self.creating_delay
        return web.json_response(self._dto(box))

    def _create_container(self, box: FakeSandbox) -> None:
        mounts = []
        for mount in box.volumes:
            host = self.root / "volumes" / mount["volumeId"]
            if mount.get("subpath"):
                host = host / mount["subpath"]
            host.mkdir(parents=True, exist_ok=True)
            os.chmod(host, 0o777)
            mounts.append(docker.types.Mount(mount["mountPath"], str(host), type="bind"))
        container = self.docker.containers.create(
            box.image,
            command=["sleep", "infinity"],
            entrypoint=[],
            init=True,
            labels={FAKE_LABEL: self.instance, "fake-daytona.id": box.id},
            environment={"HOME": HOME, "PIP_BREAK_SYSTEM_PACKAGES": "1", **box.env},
            mounts=mounts,
            mem_limit=f"{box.memory}g",
            nano_cpus=int(box.cpu * 1e9),
            pids_limit=1024,
            network_mode="none" if box.network_block_all else "bridge",
            hostname="daytona",
        )
        container.start()
        container.exec_run(["sh", "-c", f"mkdir -p {HOME} && chown {SANDBOX_UID} {HOME}"], user="0")
        box.container_id = container.id

    async def list_sandboxes(self, request: web.Request) -> web.Response:
        wanted = json.loads(request.query.get("labels") or "{}")
        items = [
            self._dto(b)
            for b in self.sandboxes.values()
            if b.state != "destroyed" and all(b.labels.get(k) == v for k, v in wanted.items())
        ]
        # Two pages when there are several, so the SDK's cursor loop is exercised.
        cursor = int(request.query.get("cursor") or 0)
        limit = int(request.query.get("limit") or 2)
        page = items[cursor : cursor + limit]
        following = cursor + limit if cursor + limit < len(items) else None
        return web.json_response(
            {"items": page, "nextCursor": str(following) if following else None}
        )

    async def get_sandbox(self, request: web.Request) -> web.Response:
        return web.json_response(self._dto(self._find(request.match_info["id"])))

    async def delete_sandbox(self, request: web.Request) -> web.Response:
        box = self._find(request.match_info["id"])

        def remove() -> None:
            try:
                self.docker.containers.get(box.container_id).remove(force=True)
            except docker.errors.NotFound:
                pass

        await self._run(remove)
        box.state = "destroyed"
        return web.json_response(self._dto(box))

    async def start_sandbox(self, request: web.Request) -> web.Response:
        box = self._find(request.match_info["id"])
        if self._state(box) != "started":
            await self._run(lambda: self.docker.containers.get(box.container_id).start())
            box.state, box.error_reason, box.updated_at = "starting", None, _now()
            box.ready_at = time.monotonic() + self.creating_delay
            self.last_activity[box.id] = time.time()
        return web.json_response(self._dto(box))

    async def stop_sandbox(self, request: web.Request) -> web.Response:
        box = self._find(request.match_info["id"])
        await self._run(lambda: self.docker.containers.get(box.container_id).stop(timeout=2))
        box.state, box.updated_at = "stopped", _now()
        return web.json_response(self._dto(box))

    async def replace_labels(self, request: web.Request) -> web.Response:
        box = self._find(request.match_info["id"])
        box.labels = (await request.json())["labels"]
        return web.json_response({"labels": box.labels})

    async def set_interval(self, request: web.Request) -> web.Response:
        box = self._find(request.match_info["id"])
        n = int(request.match_info["n"])
        kind = request.path.rsplit("/", 2)[-2]
        setattr(
            box,
            {"autostop": "auto_stop", "autodelete": "auto_delete", "autoarchive": "auto_archive"}[
                kind
            ],
            n,
        )
        return web.json_response(self._dto(box))

    async def update_activity(self, request: web.Request) -> web.Response:
        box = self._find(request.match_info["id"])
        self.last_activity[box.id] = time.time()
        return web.Response(status=201)

    async def toolbox_proxy_url(self, request: web.Request) -> web.Response:
        self._find(request.match_info["id"])
        return web.json_response({"url": self.toolbox_url})

    async def preview_url(self, request: web.Request) -> web.Response:
        """A port's preview link, as Daytona gives it whatever the sandbox's state."""
        box = self._find(request.match_info["id"])
        try:
            port = int(request.match_info["port"])
        except ValueError:
            port = 0
        if not 1 <= port <= 65535:
            return _error(400, "Invalid port")
        url = await self.preview.link(box.id, port)
        return web.json_response({"sandboxId": box.id, "url": url, "token": box.auth_token})

    def _address(self, sandbox_id: str) -> str | None:
        """The address of a running sandbox's container on Docker's default bridge."""
        box = self.sandboxes.get(sandbox_id)
        if box is None or self._state(box) != "started":
            return None
        attrs = self.docker.containers.get(box.container_id).attrs
        networks = (attrs.get("NetworkSettings") or {}).get("Networks") or {}
        return (networks.get("bridge") or {}).get("IPAddress") or None

    def _preview_token(self, sandbox_id: str) -> str | None:
        box = self.sandboxes.get(sandbox_id)
        return box.auth_token if box is not None and box.state != "destroyed" else None

    async def snapshot_sandbox(self, request: web.Request) -> web.Response:
        box = self._find(request.match_info["id"])
        name = (await request.json())["name"]
        if name in self.snapshots:
            return _error(409, f"Snapshot with name {name} already exists")
        tag = f"fake-daytona-snapshot-{self.instance[:12]}:{re.sub(r'[^a-z0-9_.-]', '-', name.lower())}"

        def commit() -> float:
            image = self.docker.containers.get(box.container_id).commit(
                repository=tag.split(":")[0], tag=tag.split(":")[1]
            )
            return image.attrs.get("Size", 0) / 2**30

        size = await self._run(commit)
        self.snapshots[name] = FakeSnapshot(
            id=uuid.uuid4().hex, name=name, image=tag, general=False, source=box.id, size=size
        )
        return web.json_response(self._dto(box))

    # -- control plane: volumes and snapshots ---------------------------------------
    def _volume_dto(self, vol: dict[str, Any]) -> dict[str, Any]:
        if vol["state"] == "pending_create" and time.monotonic() >= vol["ready_at"]:
            vol["state"] = "ready"
        keys = (
            "id",
            "name",
            "organizationId",
            "state",
            "createdAt",
            "updatedAt",
            "lastUsedAt",
            "errorReason",
        )
        return {k: vol.get(k) for k in keys}

    async def list_volumes(self, request: web.Request) -> web.Response:
        return web.json_response([self._volume_dto(v) for v in self.volumes.values()])

    async def create_volume(self, request: web.Request) -> web.Response:
        name = (await request.json())["name"]
        if any(v["name"] == name for v in self.volumes.values()):
            return _error(409, f"Volume with name {name} already exists")
        vol = {
            "id": str(uuid.uuid4()),
            "name": name,
            "organizationId": ORG,
            "state": "pending_create",
            "createdAt": _now(),
            "updatedAt": _now(),
            "lastUsedAt": None,
            "errorReason": None,
            "ready_at": time.monotonic() + 0.5,  # real volumes are not ready at once
        }
        self.volumes[vol["id"]] = vol
        return web.json_response(self._volume_dto(vol))

    async def get_volume_by_name(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        vol = next((v for v in self.volumes.values() if v["name"] == name), None)
        if vol is None:
            return _error(404, f"Volume with name {name} not found")
        return web.json_response(self._volume_dto(vol))

    async def get_volume(self, request: web.Request) -> web.Response:
        vol = self.volumes.get(request.match_info["id"])
        if vol is None:
            return _error(404, f"Volume {request.match_info['id']} not found")
        return web.json_response(self._volume_dto(vol))

    async def delete_volume(self, request: web.Request) -> web.Response:
        vol = self.volumes.pop(request.match_info["id"], None)
        if vol is None:
            return _error(404, "Volume not found")
        shutil.rmtree(self.root / "volumes" / vol["id"], ignore_errors=True)
        return web.Response(status=200)

    def _snapshot_dto(self, snap: FakeSnapshot) -> dict[str, Any]:
        return {
            "id": snap.id,
            "organizationId": None if snap.general else ORG,
            "general": snap.general,
            "name": snap.name,
            "imageName": snap.image,
            "state": snap.state,
            "size": snap.size,
            "entrypoint": None,
            "cpu": 1,
            "gpu": 0,
            "mem": 1,
            "disk": 3,
            "errorReason": None,
            "createdAt": snap.created_at,
            "updatedAt": snap.created_at,
            "lastUsedAt": None,
            "sourceSandboxId": snap.source,
        }

    def _find_snapshot(self, key: str) -> FakeSnapshot:
        snap = self.snapshots.get(key) or next(
            (s for s in self.snapshots.values() if s.id == key), None
        )
        if snap is None:
            raise web.HTTPNotFound(
                text=json.dumps({"statusCode": 404, "message": f"Snapshot {key} not found"}),
                content_type="application/json",
            )
        return snap

    async def list_snapshots(self, request: web.Request) -> web.Response:
        # Pages of two by default (as the real service pages, with a larger size), so a
        # caller that reads only the first page misses snapshots.
        items = [self._snapshot_dto(s) for s in self.snapshots.values()]
        limit = max(1, int(request.query.get("limit") or 2))
        page = max(1, int(request.query.get("page") or 1))
        pages = max(1, -(-len(items) // limit))
        chunk = items[(page - 1) * limit : page * limit]
        return web.json_response(
            {"items": chunk, "total": len(items), "page": page, "totalPages": pages}
        )

    async def get_snapshot(self, request: web.Request) -> web.Response:
        return web.json_response(self._snapshot_dto(self._find_snapshot(request.match_info["id"])))

    async def delete_snapshot(self, request: web.Request) -> web.Response:
        snap = self._find_snapshot(request.match_info["id"])
        if snap.general:
            return _error(403, "General snapshots cannot be deleted")
        del self.snapshots[snap.name]
        await self._run(lambda: self.docker.images.remove(snap.image, force=True))
        return web.Response(status=200)

    # -- toolbox ----------------------------------------------------------------------
    def _container(self, request: web.Request) -> Any:
        box = self._find(request.match_info["sid"])
        if self._state(box) != "started":
            raise web.HTTPBadGateway(
                text=json.dumps({"statusCode": 502, "message": "sandbox is not running"}),
                content_type="application/json",
            )
        self.last_activity[box.id] = time.time()
        return self.docker.containers.get(box.container_id)

    def _sh(self, container: Any, script: str, *args: str) -> tuple[int, bytes]:
        res = container.exec_run(["sh", "-c", script, "sh", *args], user=SANDBOX_UID, demux=False)
        return res.exit_code, res.output or b""

    async def system_metrics(self, request: web.Request) -> web.Response:
        """What the sandbox daemon reports about itself, from the container's stats."""
        container = self._container(request)
        box = self._find(request.match_info["sid"])
        stats = await self._run(lambda: container.stats(stream=False, one_shot=False))
        cpu, pre = stats.get("cpu_stats") or {}, stats.get("precpu_stats") or {}
        delta = (cpu.get("cpu_usage") or {}).get("total_usage", 0) - (
            pre.get("cpu_usage") or {}
        ).get("total_usage", 0)
        system = (cpu.get("system_cpu_usage") or 0) - (pre.get("system_cpu_usage") or 0)
        online = cpu.get("online_cpus") or 1
        used_pct = 100.0 * delta / system * online / box.cpu if system > 0 else 0.0
        mem = stats.get("memory_stats") or {}
        cache = (mem.get("stats") or {}).get("total_inactive_file", 0)
        return web.json_response(
            {
                "cpuCount": box.cpu,
                "cpuUsedPct": round(used_pct, 2),
                "memTotal": box.memory * 2**30,
                "memUsed": int(mem.get("usage") or 0),
                "memCache": int(cache),
                "diskTotal": box.disk * 2**30,
                "diskUsed": 0,
                "diskFree": box.disk * 2**30,
                "timestamp": _now(),
            }
        )

    async def execute(self, request: web.Request) -> web.Response:
        container = self._container(request)
        body = await request.json()
        timeout = body.get("timeout") or 0
        cmd = (
            ["timeout", str(timeout), "sh", "-c", body["command"]]
            if timeout
            else ["sh", "-c", body["command"]]
        )
        env = body.get("env") or None

        def run() -> Any:
            return container.exec_run(
                cmd, user=SANDBOX_UID, workdir=body.get("cwd") or HOME, environment=env
            )

        res = await self._run(run)
        if timeout and res.exit_code == 124:
            return _error(408, "command timed out")
        return web.json_response(
            {"exitCode": res.exit_code, "result": (res.output or b"").decode("utf-8", "replace")}
        )

    async def pty_create_connect(self, request: web.Request) -> web.StreamResponse:
        container = self._container(request)
        offered = [
            p.strip()
            for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")
            if p.strip()
        ]
        envs: dict[str, str] = {}
        for proto in offered:
            if proto.startswith("X-Daytona-Pty-Envs~"):
                raw = proto.split("~", 1)[1]
                envs = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        ws = web.WebSocketResponse(
            protocols=[PTY_SUBPROTOCOL] if PTY_SUBPROTOCOL in offered else []
        )
        await ws.prepare(request)
        # The daemon says the session is there as soon as it has made it; the fake's
        # docker exec behind it can take seconds on a loaded machine, past the SDK's
        # 10 s wait for this word. What the client sends meanwhile waits in the socket.
        await ws.send_str(json.dumps({"type": "control", "status": "connected"}))
        pty_id = request.query["id"]
        api = self.docker.api

        def open_exec() -> tuple[str, Any]:
            exec_id = api.exec_create(
                container.id,
                ["bash", "-l"],
                stdin=True,
                tty=True,
                user=SANDBOX_UID,
                workdir=request.query.get("cwd") or HOME,
                environment={"TERM": "xterm-256color", **envs},
            )["Id"]
            sock = api.exec_start(exec_id, socket=True, tty=True)
            # The daemon makes the PTY with its size. A resize right after the start can
            # come before the exec's tty exists and be lost: wait until it runs.
            deadline = time.monotonic() + 10
            while not api.exec_inspect(exec_id).get("Running") and time.monotonic() < deadline:
                time.sleep(0.01)
            api.exec_resize(
                exec_id,
                height=int(request.query.get("rows", 24)),
                width=int(request.query.get("cols", 80)),
            )
            return exec_id, sock

        exec_id, sock = await self._run(open_exec)
        raw = sock._sock
        self._ptys[(request.match_info["sid"], pty_id)] = exec_id
        self.pty_info[(request.match_info["sid"], pty_id)] = {
            "id": pty_id,
            "active": True,
            "cols": int(request.query.get("cols", 80)),
            "rows": int(request.query.get("rows", 24)),
            "cwd": request.query.get("cwd") or HOME,
            "envs": envs,
            "createdAt": _now(),
            "lazyStart": False,
        }
        loop = asyncio.get_running_loop()
        done = asyncio.Event()

        def pump_out() -> None:
            try:
                while True:
                    data = raw.recv(65536)
                    if not data:
                        break
                    asyncio.run_coroutine_threadsafe(ws.send_bytes(data), loop).result()
            except Exception:
                pass
            loop.call_soon_threadsafe(done.set)

        threading.Thread(target=pump_out, daemon=True).start()
        reader = asyncio.ensure_future(self._pty_input(ws, raw))
        await done.wait()
        reader.cancel()
        info = await self._run(api.exec_inspect, exec_id)
        code = info.get("ExitCode")
        code = -1 if code is None else code
        self._ptys.pop((request.match_info["sid"], pty_id), None)
        self.pty_info.pop((request.match_info["sid"], pty_id), None)
        if not ws.closed:
            await ws.send_str(json.dumps({"type": "control", "status": "exited", "exitCode": code}))
            await ws.close(code=1000, message=json.dumps({"exitCode": code}).encode())
        raw.close()
        return ws

    async def _pty_input(self, ws: web.WebSocketResponse, raw: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                await loop.run_in_executor(None, raw.sendall, msg.data)
            elif msg.type == WSMsgType.TEXT:
                await loop.run_in_executor(None, raw.sendall, msg.data.encode())
        # The client went away: a PTY ends with its connection (SIGHUP to the shell).
        try:
            raw.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    async def pty_delete(self, request: web.Request) -> web.Response:
        key = (request.match_info["sid"], request.match_info["pty"])
        exec_id = self._ptys.get(key)
        if exec_id is None:
            return _error(404, f"PTY session {key[1]} not found")
        pid = (await self._run(self.docker.api.exec_inspect, exec_id)).get("Pid")
        if pid:
            try:
                os.killpg(os.getpgid(pid), 9)
            except ProcessLookupError:
                pass
        return web.json_response({"message": "PTY session deleted"})

    async def pty_list(self, request: web.Request) -> web.Response:
        self._container(request)
        sid = request.match_info["sid"]
        return web.json_response(
            {"sessions": [info for (box, _), info in self.pty_info.items() if box == sid]}
        )

    async def pty_get(self, request: web.Request) -> web.Response:
        self._container(request)
        info = self.pty_info.get((request.match_info["sid"], request.match_info["pty"]))
        if info is None:
            return _error(404, f"PTY session {request.match_info['pty']} not found")
        return web.json_response(info)

    async def pty_resize(self, request: web.Request) -> web.Response:
        """As the daemon: 1-1000 rows and columns (400 otherwise), the terminal resized
        (its foreground program gets SIGWINCH), the session's info returned."""
        self._container(request)
        key = (request.match_info["sid"], request.match_info["pty"])
        exec_id, info = self._ptys.get(key), self.pty_info.get(key)
        if exec_id is None or info is None:
            return _error(404, f"PTY session {key[1]} not found")
        body = await request.json()
        rows, cols = body.get("rows"), body.get("cols")
        if not all(isinstance(v, int) and 1 <= v <= 1000 for v in (rows, cols)):
            return _error(400, "rows and cols must be integers from 1 to 1000")
        await self._run(lambda: self.docker.api.exec_resize(exec_id, height=rows, width=cols))
        info.update(rows=rows, cols=cols)
        return web.json_response(info)

    async def list_files(self, request: web.Request) -> web.Response:
        container = self._container(request)
        script = (
            "import json,os,pwd,grp,stat,sys\n"
            "p=sys.argv[1]\n"
            "if not os.path.isdir(p): print(json.dumps({'missing': True})); sys.exit()\n"
            "out=[]\n"
            "for n in sorted(os.listdir(p)):\n"
            " s=os.lstat(os.path.join(p,n))\n"
            " out.append({'name':n,'isDir':stat.S_ISDIR(s.st_mode),'size':s.st_size,"
            "'mode':stat.filemode(s.st_mode),'modTime':str(s.st_mtime),"
            "'permissions':oct(s.st_mode&0o777),'owner':str(s.st_uid),'group':str(s.st_gid)})\n"
            "print(json.dumps(out))\n"
        )
        path = request.query.get("path") or HOME
        res = await self._run(
            lambda: container.exec_run(["python3", "-c", script, path], user=SANDBOX_UID)
        )
        data = json.loads(res.output or b"null")
        if not isinstance(data, list):
            return _error(404, f"directory {path} not found")
        return web.json_response(data)

    async def file_info(self, request: web.Request) -> web.Response:
        container = self._container(request)
        path = request.query["path"]
        code, out = await self._run(self._sh, container, 'stat -c "%s %F" "$1"', path)
        if code:
            return _error(404, f"file {path} not found")
        size, _, kind = out.decode().strip().partition(" ")
        return web.json_response(
            {
                "name": os.path.basename(path),
                "isDir": kind == "directory",
                "size": int(size),
                "mode": "",
                "modTime": "",
                "permissions": "",
                "owner": "",
                "group": "",
            }
        )

    async def delete_file(self, request: web.Request) -> web.Response:
        container = self._container(request)
        path = request.query["path"]
        flag = "-rf" if request.query.get("recursive") == "true" else "-f"
        code, out = await self._run(self._sh, container, f'test -e "$1" && rm {flag} "$1"', path)
        if code:
            return _error(404, f"file {path} not found")
        return web.Response(status=204)

    async def create_folder(self, request: web.Request) -> web.Response:
        container = self._container(request)
        code, out = await self._run(self._sh, container, 'mkdir -p "$1"', request.query["path"])
        if code:
            return _error(400, out.decode("utf-8", "replace"))
        return web.Response(status=201)

    async def bulk_upload(self, request: web.Request) -> web.Response:
        container = self._container(request)
        reader = await request.multipart()
        paths: dict[str, str] = {}
        staged: dict[str, Path] = {}
        tmp = self.root / "uploads" / uuid.uuid4().hex
        tmp.mkdir(parents=True)
        try:
            while (part := await reader.next()) is not None:
                index = re.match(r"files\[(\d+)\]\.(path|file)", part.name or "")
                if not index:
                    continue
                if index.group(2) == "path":
                    paths[index.group(1)] = (await part.read()).decode()
                else:
                    target = tmp / index.group(1)
                    with open(target, "wb") as out:
                        while chunk := await part.read_chunk(1 << 20):
                            out.write(chunk)
                    staged[index.group(1)] = target
            for i, local in staged.items():
                await self._run(self._put, container, paths[i], local)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return web.json_response({"files": [{"path": p} for p in paths.values()]})

    def _put(self, container: Any, path: str, local: Path) -> None:
        if not path.startswith("/"):
            path = f"{HOME}/{path}"
        folder, name = os.path.split(path)
        self._sh(container, 'mkdir -p "$1"', folder)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tar.gettarinfo(str(local), arcname=name)
            info.uid = info.gid = 1000
            info.uname = info.gname = ""
            info.mode = 0o644
            with open(local, "rb") as fh:
                tar.addfile(info, fh)
        buf.seek(0)
        if not container.put_archive(folder, buf):
            raise web.HTTPBadRequest(text=f"cannot write {path}")

    async def bulk_download(self, request: web.Request) -> web.StreamResponse:
        container = self._container(request)
        paths = (await request.json())["paths"]
        boundary = uuid.uuid4().hex
        response = web.StreamResponse(
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
        )
        await response.prepare(request)
        for path in paths:
            full = path if path.startswith("/") else f"{HOME}/{path}"
            try:
                stream, stat = await self._run(container.get_archive, full)
            except docker.errors.NotFound:
                stream, stat = None, None
            if stream is None or stat.get("mode", 0) & (1 << 31):
                body = json.dumps(
                    {"message": f"file not found: {path}", "statusCode": 404, "code": "NOT_FOUND"}
                )
                await response.write(
                    f'--{boundary}\r\nContent-Disposition: form-data; name="error"; filename="{path}"\r\n'
                    f"Content-Type: application/json\r\n\r\n{body}\r\n".encode()
                )
                continue
            await response.write(
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{path}"\r\n'
                "Content-Type: application/octet-stream\r\n\r\n".encode()
            )
            await self._stream_tar_member(stream, response)
            await response.write(b"\r\n")
        await response.write(f"--{boundary}--\r\n".encode())
        await response.write_eof()
        return response

    async def _stream_tar_member(self, stream: Any, response: web.StreamResponse) -> None:
        """Write the one file of a ``get_archive`` tar stream without holding it whole."""
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=8)
        loop = asyncio.get_running_loop()

        def produce() -> None:
            with tarfile.open(
                fileobj=io.BufferedReader(_IterReader(stream), 1 << 20), mode="r|"
            ) as tar:
                member = tar.next()
                fh = tar.extractfile(member) if member is not None else None
                while fh is not None and (chunk := fh.read(1 << 20)):
                    asyncio.run_coroutine_threadsafe(queue.put(chunk), loop).result()
            asyncio.run_coroutine_threadsafe(queue.put(None), loop).result()

        loop.run_in_executor(None, produce)
        while (chunk := await queue.get()) is not None:
            await response.write(chunk)
