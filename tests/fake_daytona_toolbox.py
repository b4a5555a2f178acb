"""The fake Daytona's toolbox: the daemon API each sandbox serves under
``/toolbox/{sandbox}`` (process execution, PTY sessions, files, system metrics), answered
from the sandbox's container as Daytona's daemon answers them (checked against the
``daytona`` SDK 0.226's generated toolbox client). :class:`~.fake_daytona.FakeDaytona`
serves it beside its control plane, and the helpers here (error bodies, timestamps) are
the ones both use.
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
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from http import HTTPStatus
from pathlib import Path
from typing import Any

import docker
from aiohttp import WSMsgType, web

SANDBOX_UID = "1000:1000"
HOME = "/home/daytona"
PTY_SUBPROTOCOL = "X-Daytona-Pty-Exit-Control"


def now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def error(status: int, message: str) -> web.Response:
    return web.json_response(
        {
            "statusCode": status,
            "message": message,
            "error": HTTPStatus(status).phrase,
            "code": None,
        },
        status=status,
    )


class IterReader(io.RawIOBase):
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


async def in_thread(fn: Any, *args: Any) -> Any:
    """Run a blocking call (the Docker SDK's) off the server's event loop."""
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)


class Toolbox:
    """The toolbox routes of every sandbox. ``running(sandbox_id)`` gives a started
    sandbox and its container, or raises the 502 Daytona answers for one that is not."""

    def __init__(
        self, running: Callable[[str], tuple[Any, Any]], engine: docker.DockerClient, uploads: Path
    ) -> None:
        self.running = running
        self.docker = engine
        self.uploads = uploads
        self._ptys: dict[tuple[str, str], str] = {}  # (sandbox, pty id) -> exec id
        # (sandbox, pty id) -> PtySessionInfo as the daemon reports it (size, cwd, envs)
        self.pty_info: dict[tuple[str, str], dict[str, Any]] = {}

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/toolbox/{sid}/system/metrics", self.system_metrics)
        router.add_post("/toolbox/{sid}/process/execute", self.execute)
        router.add_get("/toolbox/{sid}/process/pty/create-connect", self.pty_create_connect)
        router.add_delete("/toolbox/{sid}/process/pty/{pty}", self.pty_delete)
        router.add_get("/toolbox/{sid}/process/pty", self.pty_list)
        router.add_get("/toolbox/{sid}/process/pty/{pty}", self.pty_get)
        router.add_post("/toolbox/{sid}/process/pty/{pty}/resize", self.pty_resize)
        router.add_get("/toolbox/{sid}/files", self.list_files)
        router.add_delete("/toolbox/{sid}/files", self.delete_file)
        router.add_post("/toolbox/{sid}/files/folder", self.create_folder)
        router.add_get("/toolbox/{sid}/files/info", self.file_info)
        router.add_post("/toolbox/{sid}/files/bulk-upload", self.bulk_upload)
        router.add_post("/toolbox/{sid}/files/bulk-download", self.bulk_download)

    def _container(self, request: web.Request) -> Any:
        return self.running(request.match_info["sid"])[1]

    def _sh(self, container: Any, script: str, *args: str) -> tuple[int, bytes]:
        res = container.exec_run(["sh", "-c", script, "sh", *args], user=SANDBOX_UID, demux=False)
        return res.exit_code, res.output or b""

    async def system_metrics(self, request: web.Request) -> web.Response:
        """What the sandbox daemon reports about itself, from the container's stats."""
        box, container = self.running(request.match_info["sid"])
        stats = await in_thread(lambda: container.stats(stream=False, one_shot=False))
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
                "timestamp": now(),
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

        res = await in_thread(run)
        if timeout and res.exit_code == 124:
            return error(408, "command timed out")
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

        exec_id, sock = await in_thread(open_exec)
        raw = sock._sock
        self._ptys[(request.match_info["sid"], pty_id)] = exec_id
        self.pty_info[(request.match_info["sid"], pty_id)] = {
            "id": pty_id,
            "active": True,
            "cols": int(request.query.get("cols", 80)),
            "rows": int(request.query.get("rows", 24)),
            "cwd": request.query.get("cwd") or HOME,
            "envs": envs,
            "createdAt": now(),
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
        info = await in_thread(api.exec_inspect, exec_id)
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
            return error(404, f"PTY session {key[1]} not found")
        pid = (await in_thread(self.docker.api.exec_inspect, exec_id)).get("Pid")
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
            return error(404, f"PTY session {request.match_info['pty']} not found")
        return web.json_response(info)

    async def pty_resize(self, request: web.Request) -> web.Response:
        """As the daemon: 1-1000 rows and columns (400 otherwise), the terminal resized
        (its foreground program gets SIGWINCH), the session's info returned."""
        self._container(request)
        key = (request.match_info["sid"], request.match_info["pty"])
        exec_id, info = self._ptys.get(key), self.pty_info.get(key)
        if exec_id is None or info is None:
            return error(404, f"PTY session {key[1]} not found")
        body = await request.json()
        rows, cols = body.get("rows"), body.get("cols")
        if not all(isinstance(v, int) and 1 <= v <= 1000 for v in (rows, cols)):
            return error(400, "rows and cols must be integers from 1 to 1000")
        await in_thread(lambda: self.docker.api.exec_resize(exec_id, height=rows, width=cols))
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
        res = await in_thread(
            lambda: container.exec_run(["python3", "-c", script, path], user=SANDBOX_UID)
        )
        data = json.loads(res.output or b"null")
        if not isinstance(data, list):
            return error(404, f"directory {path} not found")
        return web.json_response(data)

    async def file_info(self, request: web.Request) -> web.Response:
        container = self._container(request)
        path = request.query["path"]
        code, out = await in_thread(self._sh, container, 'stat -c "%s %F" "$1"', path)
        if code:
            return error(404, f"file {path} not found")
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
        code, out = await in_thread(self._sh, container, f'test -e "$1" && rm {flag} "$1"', path)
        if code:
            return error(404, f"file {path} not found")
        return web.Response(status=204)

    async def create_folder(self, request: web.Request) -> web.Response:
        container = self._container(request)
        code, out = await in_thread(self._sh, container, 'mkdir -p "$1"', request.query["path"])
        if code:
            return error(400, out.decode("utf-8", "replace"))
        return web.Response(status=201)

    async def bulk_upload(self, request: web.Request) -> web.Response:
        container = self._container(request)
        reader = await request.multipart()
        paths: dict[str, str] = {}
        staged: dict[str, Path] = {}
        tmp = self.uploads / uuid.uuid4().hex
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
                await in_thread(self._put, container, paths[i], local)
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
                stream, stat = await in_thread(container.get_archive, full)
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
                fileobj=io.BufferedReader(IterReader(stream), 1 << 20), mode="r|"
            ) as tar:
                member = tar.next()
                fh = tar.extractfile(member) if member is not None else None
                while fh is not None and (chunk := fh.read(1 << 20)):
                    asyncio.run_coroutine_threadsafe(queue.put(chunk), loop).result()
            asyncio.run_coroutine_threadsafe(queue.put(None), loop).result()

        loop.run_in_executor(None, produce)
        while (chunk := await queue.get()) is not None:
            await response.write(chunk)
