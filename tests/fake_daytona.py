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
* ``slow(pattern, seconds, times)`` — the next matching requests are answered late;
* ``auto_stop(sandbox_id)`` — what Daytona does when the idle timer fires; the timer
  itself runs too, counting only API and toolbox requests as activity (as Daytona
  does), with ``seconds_per_minute`` to make its minutes short in tests;
* ``last_activity[sandbox_id]`` — when the API last saw activity (refresh_activity).

The toolbox (``/toolbox/{id}/...``: commands, PTYs, files, metrics) is
:class:`~.fake_daytona_toolbox.Toolbox` (``toolbox``). Preview links
(``GET /sandbox/{id}/ports/{port}/preview-url``) are served by
:class:`~.fake_daytona_preview.PreviewProxy` (``preview``), which needs the sandbox's
token as Daytona's proxy does.

Socket.IO is answered with 404, so the SDK falls back to polling sandbox state.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import docker
from aiohttp import web

from .fake_daytona_preview import PreviewProxy
from .fake_daytona_toolbox import HOME, SANDBOX_UID, Toolbox, error, in_thread, now

API_KEY = "fake-daytona-key"
FAKE_LABEL = "fake-daytona"
ORG = "org-fake"


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
    created_at: str = field(default_factory=now)
    updated_at: str = field(default_factory=now)
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
    created_at: str = field(default_factory=now)


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
        self._delays: list[list[Any]] = []
        self.toolbox = Toolbox(self._running, self.docker, self.root / "uploads")
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

    def slow(self, pattern: str, seconds: float, times: int = 1) -> None:
        """The next ``times`` requests whose "METHOD path" matches ``pattern`` are
        answered ``seconds`` late (a loaded control plane or a slow link)."""
        with self._lock:
            self._delays.append([re.compile(pattern), seconds, times])

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._delays.clear()

    def _delay_for(self, method: str, path: str) -> float:
        with self._lock:
            for delay in self._delays:
                pattern, seconds, times = delay
                if times > 0 and pattern.search(f"{method} {path}"):
                    delay[2] -= 1
                    return float(seconds)
        return 0.0

    def _fault_for(self, method: str, path: str) -> web.Response | None:
        with self._lock:
            for fault in self._faults:
                pattern, status, times, message = fault
                if times > 0 and pattern.search(f"{method} {path}"):
                    fault[2] -= 1
                    text = message or {429: "Too many requests", 502: "Bad gateway"}.get(
                        status, "injected"
                    )
                    return error(status, text)
        return None

    def auto_stop(self, sandbox_id: str) -> None:
        """Stop a sandbox the way Daytona's idle timer does."""
        box = self.sandboxes[sandbox_id]
        self.docker.containers.get(box.container_id).stop(timeout=1)
        box.state, box.updated_at = "stopped", now()

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
        self.toolbox.add_routes(r)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if "socket.io" in request.path:
            return await handler(request)
        if request.headers.get("Authorization") != f"Bearer {API_KEY}":
            return error(401, "Invalid API key")
        fault = self._fault_for(request.method, request.path)
        if fault is not None:
            return fault
        delay = self._delay_for(request.method, request.path)
        if delay:
            await asyncio.sleep(delay)
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except KeyError as exc:
            return error(404, f"Not found: {exc}")
        finally:
            # A toolbox request is activity until it is answered: the idle timer never
            # stops a sandbox under a command that is still running.
            box = self.sandboxes.get(request.match_info.get("sid", ""))
            if box is not None:
                self.last_activity[box.id] = time.time()

    async def _no_socketio(self, request: web.Request) -> web.Response:
        return web.Response(status=404, text="no socket.io here")

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
            return error(
                400,
                f"Snapshot {snapshot_name} not found. Did you add it through the Daytona Dashboard?",
            )
        if body.get("name") and any(
            b.name == body["name"] and b.state != "destroyed" for b in self.sandboxes.values()
        ):
            return error(409, f"Sandbox with name {body['name']} already exists")
        for mount in body.get("volumes") or []:
            vol = self.volumes.get(mount["volumeId"])
            if vol is None or vol["state"] != "ready":
                return error(400, f"Volume {mount['volumeId']} is not in a ready state")
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
            await in_thread(self._create_container, box)
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

        await in_thread(remove)
        box.state = "destroyed"
        return web.json_response(self._dto(box))

    async def start_sandbox(self, request: web.Request) -> web.Response:
        box = self._find(request.match_info["id"])
        if self._state(box) != "started":
            await in_thread(lambda: self.docker.containers.get(box.container_id).start())
            box.state, box.error_reason, box.updated_at = "starting", None, now()
            box.ready_at = time.monotonic() + self.creating_delay
            self.last_activity[box.id] = time.time()
        return web.json_response(self._dto(box))

    async def stop_sandbox(self, request: web.Request) -> web.Response:
        box = self._find(request.match_info["id"])
        await in_thread(lambda: self.docker.containers.get(box.container_id).stop(timeout=2))
        box.state, box.updated_at = "stopped", now()
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
            return error(400, "Invalid port")
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
            return error(409, f"Snapshot with name {name} already exists")
        tag = f"fake-daytona-snapshot-{self.instance[:12]}:{re.sub(r'[^a-z0-9_.-]', '-', name.lower())}"

        def commit() -> float:
            image = self.docker.containers.get(box.container_id).commit(
                repository=tag.split(":")[0], tag=tag.split(":")[1]
            )
            return image.attrs.get("Size", 0) / 2**30

        size = await in_thread(commit)
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
            return error(409, f"Volume with name {name} already exists")
        vol = {
            "id": str(uuid.uuid4()),
            "name": name,
            "organizationId": ORG,
            "state": "pending_create",
            "createdAt": now(),
            "updatedAt": now(),
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
            return error(404, f"Volume with name {name} not found")
        return web.json_response(self._volume_dto(vol))

    async def get_volume(self, request: web.Request) -> web.Response:
        vol = self.volumes.get(request.match_info["id"])
        if vol is None:
            return error(404, f"Volume {request.match_info['id']} not found")
        return web.json_response(self._volume_dto(vol))

    async def delete_volume(self, request: web.Request) -> web.Response:
        vol = self.volumes.pop(request.match_info["id"], None)
        if vol is None:
            return error(404, "Volume not found")
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
            return error(403, "General snapshots cannot be deleted")
        del self.snapshots[snap.name]
        await in_thread(lambda: self.docker.images.remove(snap.image, force=True))
        return web.Response(status=200)

    def _running(self, sandbox_id: str) -> tuple[FakeSandbox, Any]:
        """A started sandbox and its container, for the toolbox; a toolbox request is
        activity. Daytona's proxy answers 502 for a sandbox that is not running."""
        box = self._find(sandbox_id)
        if self._state(box) != "started":
            raise web.HTTPBadGateway(
                text=json.dumps({"statusCode": 502, "message": "sandbox is not running"}),
                content_type="application/json",
            )
        self.last_activity[box.id] = time.time()
        return box, self.docker.containers.get(box.container_id)
