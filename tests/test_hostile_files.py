"""An attacker's test of the REST file routes (``/api/sandboxes/{id}/files...``).

The code inside the sandbox is hostile (docs/operators/security.md): it can change any
path under the workspace at any moment, including while the server is in the middle
of a request. Every test here runs a real Jupyter server (pytest-jupyter's
``jp_fetch``) and a real Docker sandbox, and most of them start an attack loop INSIDE
the container while the test drives the REST API from outside.

The host "secrets" live in ``tmp_path``, outside the workspace: a 0600 file holding
``HOST-SECRET`` and a host folder holding ``f`` (= ``HOST-SECRET``) and
``host-only.txt``. The container cannot see them, but it can plant symlinks whose
target text is their HOST absolute path: a server on the host that follows such a
link reads, writes, chmods or deletes host files for the sandbox.

Every attack loop ends by itself (``ATTACK_SECONDS``), is stopped by the test when
its phase is over (its stdin is closed) and reports what it did; the test checks
that report, so a pass is never a pass because the attacker did not run. Every race
is bounded in tries and in time.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPRequest
from tornado.simple_httpclient import SimpleAsyncHTTPClient

from .file_attacks import (
    EXCHANGE,
    PHASE_SECONDS,
    SECRET,
    FifoRescue,
    HostSecrets,
    Reply,
    answer,
    call,
    files,
    finish_attack,
    make_host_folder,
    raw_http,
    read_nofollow,
    request_head,
    sandbox_run,
    saw_both,
    start_attack,
    summary,
    workspace_leftovers,
)
from .file_attacks import _stop_attackers as _stop_attackers  # noqa: F401 (autouse)
from .file_attacks import fifo_rescue as fifo_rescue  # noqa: F401 (a fixture)
from .file_attacks import jp_server_config as jp_server_config  # noqa: F401 (a fixture)
from .file_attacks import secrets as secrets  # noqa: F401 (a fixture)

pytestmark = pytest.mark.docker


# -- 1. upload temp-file swap -------------------------------------------------------------

_SWAP_DOT_NAMES = r"""
import os
secret = ARGS["secret"]
os.makedirs("up", exist_ok=True)
stats.update(replaced=0, renamed_over=0, errors=0)
seen = set()
n = 0
ready()
while running():
    stats["loops"] += 1
    try:
        names = os.listdir("up")
    except OSError:
        continue
    for name in names:
        if not name.startswith(".") or name.startswith(".atk-") or name in seen:
            continue
        path = "up/" + name
        n += 1
        try:
            if n % 2:  # unlink the server's file, plant a link under its name
                os.unlink(path)
                os.symlink(secret, path)
                stats["replaced"] += 1
            else:  # or rename a link over it atomically
                tmp = "up/.atk-%d" % n
                os.symlink(secret, tmp)
                os.rename(tmp, path)
                stats["renamed_over"] += 1
            seen.add(name)
        except OSError:
            stats["errors"] += 1
"""


@pytest.mark.timeout(120)
async def test_upload_temp_file_swap(
    jp_fetch: Any, sandbox: dict[str, str], secrets: HostSecrets
) -> None:
    """Uploads while the sandbox swaps the server's temporary file for a link out.

    The attack: an upload is written to a temporary file beside the target and renamed
    into place. The attacker lists ``up/`` in a tight loop and replaces every dot-name
    it sees (the temporary file) with a symlink to the host secret file, by unlink +
    symlink and by renaming a link over it. A server that then chmods/chowns/renames
    the temporary file by name changes the host secret's mode or owner, or puts the
    link in place of the upload and still says 201.

    Required: the secret is untouched; every answer is 201 with exactly a regular file
    ``up/target.bin`` holding one of the uploads, or a 400/409 JSON message.
    """
    sid, ws = sandbox["id"], Path(sandbox["workspace"])
    sent: set[bytes] = set()
    problems: list[str] = []
    codes: dict[int, int] = {}
    attacker = start_attack(sandbox["engine_id"], _SWAP_DOT_NAMES, secret=str(secrets.file))
    deadline = time.monotonic() + PHASE_SECONDS
    for i in range(50):
        if time.monotonic() > deadline:
            break
        body = (b"upload-%03d " % i) * 6000  # ~66 KB, distinct per upload
        sent.add(body)
        reply = await call(jp_fetch, *files(sid, "up/target.bin"), method="PUT", body=body)
        codes[reply.code] = codes.get(reply.code, 0) + 1
        if reply.code == 201:
            kind, content = read_nofollow(ws / "up" / "target.bin")
            if kind != "file":
                problems.append(f"201 but up/target.bin is a {kind}, not the uploaded file")
                os.unlink(ws / "up" / "target.bin")  # so that the next upload is measured afresh
            elif content not in sent:
                problems.append("201 but up/target.bin holds none of the uploads")
        elif not reply.is_json_4xx(400, 409):
            problems.append(f"answer {reply.code} (only 201 or a 400/409 JSON message): {reply!r}")
        found = secrets.problems()
        if found:
            problems.extend(found)
            secrets.restore()
    stats = finish_attack(attacker, loops=100)
    print(f"answers {codes}; attacker {stats}")
    assert not problems, f"{summary(problems)}\nanswers {codes}; attacker {stats}"
    assert sum(codes.values()) >= 20, f"too few uploads in {PHASE_SECONDS} s: {codes}"


# -- 2. folder swap race -----------------------------------------------------------------


_MAKE_D_AND_X = r"""
import json, os, sys
args = json.loads(sys.argv[1])
os.makedirs(args["real"])
with open(os.path.join(args["real"], args["file"]), "wb") as fh:
    fh.write(b"inside")
os.symlink(args["host"], args["link"])
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("operation", ["download", "listing", "delete", "upload"])
async def test_folder_swap_race(
    jp_fetch: Any, sandbox: dict[str, str], secrets: HostSecrets, operation: str
) -> None:
    """Requests on ``d/...`` while the sandbox swaps the folder ``d`` for a link out.

    The attack (docker cp's CVE-2018-15664): the workspace holds a real folder ``d``
    (with ``f`` = ``inside``) and a symlink ``x`` -> the host folder (with ``f`` =
    HOST-SECRET and ``host-only.txt``). The attacker exchanges the two names with
    renameat2(RENAME_EXCHANGE) in a tight loop, so a server that checks ``d`` and then
    uses the name ``d`` again may check the real folder and act in the host folder.

    Required, each of 200 downloads / 200 listings / 100 deletes / 100 uploads (bounded
    in time): a download never returns HOST-SECRET, a listing never shows
    ``host-only.txt``, a delete never removes the host ``f``, an upload never creates
    anything in the host folder; the answer is never a 5xx (4xx is fine).
    """
    sid, ws = sandbox["id"], Path(sandbox["workspace"])
    sandbox_run(
        sandbox["engine_id"], _MAKE_D_AND_X, real="d", file="f", link="x", host=str(secrets.folder)
    )
    inside = os.open(
        ws / "d", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    )  # the real d, whatever its name
    tries = {"download": 200, "listing": 200, "delete": 100, "upload": 100}[operation]
    problems: list[str] = []
    codes: dict[int, int] = {}
    try:
        attacker = start_attack(sandbox["engine_id"], EXCHANGE, a="d", b="x")
        saw_both(ws / "d")
        deadline = time.monotonic() + PHASE_SECONDS
        done = 0
        for i in range(tries):
            if time.monotonic() > deadline:
                break
            done += 1
            if operation == "download":
                reply = await call(jp_fetch, *files(sid, "d/f"))
                if reply.code == 200 and SECRET in reply.body:
                    problems.append("a download of d/f returned the host folder's f (HOST-SECRET)")
            elif operation == "listing":
                reply = await call(jp_fetch, *files(sid), params={"path": "d"})
                if reply.code == 200:
                    names = {e["name"] for e in json.loads(reply.body)["entries"]}
                    if "host-only.txt" in names:
                        problems.append(f"a listing of d showed the host folder: {sorted(names)}")
            elif operation == "delete":
                if "f" not in os.listdir(
                    inside
                ):  # the previous try deleted the inside f: put it back
                    fd = os.open("f", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=inside)
                    os.write(fd, b"inside")
                    os.close(fd)
                reply = await call(jp_fetch, *files(sid, "d/f"), method="DELETE")
            else:
                reply = await call(
                    jp_fetch, *files(sid, f"d/new-{i}.txt"), method="PUT", body=b"new %d" % i
                )
            codes[reply.code] = codes.get(reply.code, 0) + 1
            if reply.code >= 500 or (reply.code >= 400 and not reply.is_json_4xx(reply.code)):
                problems.append(f"{operation}: answer {reply.code} {reply!r}")
            found = secrets.problems()
            if found:
                problems.extend(f"{operation}: {text}" for text in found)
                secrets.restore()
        stats = finish_attack(attacker, swaps=1000)
    finally:
        os.close(inside)
    print(f"{operation}: answers {codes} in {done} tries; attacker {stats}")
    assert not problems, f"{summary(problems)}\nanswers {codes} in {done} tries; attacker {stats}"
    assert done >= min(tries, 50), f"too few tries in {PHASE_SECONDS} s: {codes}"


_MAKE_MID_PATH = r"""
import json, os, sys
args = json.loads(sys.argv[1])
os.makedirs("a/b")
with open("a/b/c.txt", "wb") as fh:
    fh.write(b"inside")
os.symlink(args["host"], "a/l")
"""


@pytest.mark.timeout(120)
async def test_mid_path_swap_race(jp_fetch: Any, sandbox: dict[str, str], tmp_path: Path) -> None:
    """The same race one level deeper: ``a/b/c.txt`` while ``a/b`` is swapped for a link.

    The attack: ``a/b`` is a real folder (``c.txt`` = ``inside``), ``a/l`` a symlink to
    a host folder holding ``c.txt`` = HOST-SECRET and ``host-only.txt``; the attacker
    exchanges ``a/b`` and ``a/l`` continuously. A server that checks only the first
    component, or the whole path once and then opens it by name, ends up in the host.

    Required (bounded): downloads of ``a/b/c.txt`` never return HOST-SECRET, listings
    of ``a/b`` never show ``host-only.txt``, uploads to ``a/b/new-N.txt`` never create
    anything in the host folder; no 5xx.
    """
    host = make_host_folder(tmp_path / "host-folder-2", first="c.txt")
    sid, ws = sandbox["id"], Path(sandbox["workspace"])
    sandbox_run(sandbox["engine_id"], _MAKE_MID_PATH, host=str(host))
    problems: list[str] = []
    codes: dict[int, int] = {}
    attacker = start_attack(sandbox["engine_id"], EXCHANGE, a="a/b", b="a/l")
    saw_both(ws / "a" / "b")
    deadline = time.monotonic() + PHASE_SECONDS
    for i in range(300):
        if time.monotonic() > deadline:
            break
        kind = ("download", "listing", "upload")[i % 3]
        if kind == "download":
            reply = await call(jp_fetch, *files(sid, "a/b/c.txt"))
            if reply.code == 200 and SECRET in reply.body:
                problems.append("a download of a/b/c.txt returned the host file (HOST-SECRET)")
        elif kind == "listing":
            reply = await call(jp_fetch, *files(sid), params={"path": "a/b"})
            if reply.code == 200 and "host-only.txt" in {
                e["name"] for e in json.loads(reply.body)["entries"]
            }:
                problems.append("a listing of a/b showed the host folder")
        else:
            reply = await call(jp_fetch, *files(sid, f"a/b/new-{i}.txt"), method="PUT", body=b"new")
        codes[reply.code] = codes.get(reply.code, 0) + 1
        if reply.code >= 500 or (reply.code >= 400 and not reply.is_json_4xx(reply.code)):
            problems.append(f"{kind}: answer {reply.code} {reply!r}")
        names = set(os.listdir(host))
        if names != {"c.txt", "host-only.txt"} or (host / "c.txt").read_bytes() != SECRET:
            problems.append(f"{kind}: the host folder changed: {sorted(names)}")
            for name in names - {"c.txt", "host-only.txt"}:
                (host / name).unlink()
            (host / "c.txt").write_bytes(SECRET)
    stats = finish_attack(attacker, swaps=1000)
    print(f"answers {codes}; attacker {stats}")
    assert not problems, f"{summary(problems)}\nanswers {codes}; attacker {stats}"
    assert sum(codes.values()) >= 60, f"too few tries in {PHASE_SECONDS} s: {codes}"


# -- 3. static links ----------------------------------------------------------------------

_PLANT_LINKS = r"""
import json, os, sys
args = json.loads(sys.argv[1])
os.symlink(args["secret"], "out")
os.symlink(args["folder"], "dirlink")
"""


async def test_static_links_out_of_the_workspace(
    jp_fetch: Any, sandbox: dict[str, str], secrets: HostSecrets
) -> None:
    """Links planted once: ``out`` -> the host secret file, ``dirlink`` -> the host folder.

    Required: reading through either is 400, listing ``dirlink`` is 400, uploading to
    ``dirlink/new`` is 400 and creates nothing on the host, and deleting ``out`` removes
    the link itself (204) while the secret stays.
    """
    sid, ws = sandbox["id"], Path(sandbox["workspace"])
    sandbox_run(
        sandbox["engine_id"], _PLANT_LINKS, secret=str(secrets.file), folder=str(secrets.folder)
    )
    problems: list[str] = []
    checks = [
        ("GET out", await call(jp_fetch, *files(sid, "out")), 400),
        ("GET dirlink/f", await call(jp_fetch, *files(sid, "dirlink/f")), 400),
        ("list dirlink", await call(jp_fetch, *files(sid), params={"path": "dirlink"}), 400),
        (
            "PUT dirlink/new",
            await call(jp_fetch, *files(sid, "dirlink/new"), method="PUT", body=b"x"),
            400,
        ),
    ]
    for what, reply, expected in checks:
        if SECRET in reply.body or b"host-only" in reply.body:
            problems.append(f"{what} revealed the host: {reply!r}")
        if not reply.is_json_4xx(expected):
            problems.append(f"{what}: {reply!r}, expected a {expected} JSON message")
    deleted = await call(jp_fetch, *files(sid, "out"), method="DELETE")
    if deleted.code != 204:
        problems.append(f"DELETE out (the link itself): {deleted!r}, expected 204")
    elif os.path.lexists(ws / "out"):
        problems.append("DELETE out said 204 but the link is still there")
    problems += secrets.problems()
    assert not problems, "\n".join(problems)


# -- 4. FIFOs and sockets -----------------------------------------------------------------

_LISTEN_UNIX = r"""
import os, socket, time
os.mkfifo("pipe")
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind("sock")
server.listen(16)
server.setblocking(False)
stats["accepted"] = 0
ready()
while running():
    stats["loops"] += 1
    try:
        conn, _ = server.accept()
        stats["accepted"] += 1
        conn.close()
    except BlockingIOError:
        time.sleep(0.02)
"""


@pytest.mark.timeout(120)
async def test_fifo_and_socket(
    jp_fetch: Any, jp_serverapp: Any, sandbox: dict[str, str], fifo_rescue: FifoRescue
) -> None:
    """A FIFO ``pipe`` and a listening unix socket ``sock`` left in the workspace.

    The attack: opening a FIFO for reading blocks until a writer comes, and the sandbox
    never writes; a server that opens it in a worker thread loses that thread for
    good, and a few such requests take every worker, so every route hangs, and the
    stuck threads keep the server process from exiting.

    Required: a GET of either answers 400 within 5 s; 7 concurrent GETs of the FIFO
    each answer 400 within 5 s and a listing answers meanwhile; a PUT onto ``pipe`` is
    400 (the FIFO stays); the listing reports both with type "other"; and when the
    test ends no server thread is left blocked on the FIFO (the ``fifo_rescue``
    fixture checks that after the server's shutdown).
    """
    sid, ws = sandbox["id"], Path(sandbox["workspace"])
    attacker = start_attack(sandbox["engine_id"], _LISTEN_UNIX)
    fifo_rescue.watch(ws / "pipe")
    assert stat.S_ISFIFO(os.lstat(ws / "pipe").st_mode) and stat.S_ISSOCK(
        os.lstat(ws / "sock").st_mode
    )
    base = f"http://127.0.0.1:{jp_serverapp.port}{jp_serverapp.base_url}api/sandboxes/{sid}/files"
    auth = {"Authorization": f"token {jp_serverapp.identity_provider.token}"}
    client = SimpleAsyncHTTPClient(
        force_instance=True, max_clients=32
    )  # room for the concurrent GETs

    async def get(url: str) -> Reply:
        return await answer(
            client.fetch(HTTPRequest(url, headers=auth, request_timeout=30)), timeout=5
        )

    problems: list[str] = []
    try:
        for name in ("pipe", "sock"):
            reply = await get(f"{base}/{name}")
            if not reply.is_json_4xx(400):
                problems.append(f"GET {name}: {reply!r}, expected 400 within 5 s")
            stuck = fifo_rescue.release()
            if stuck:
                problems.append(
                    f"GET {name} left a server thread blocked opening the FIFO (released by the test)"
                )

        fifo_gets = [asyncio.ensure_future(get(f"{base}/pipe")) for _ in range(7)]
        await asyncio.sleep(0.5)  # let them reach the server
        listing = await get(f"{base}?path=")
        if listing.code != 200:
            problems.append(
                f"a listing while 7 GETs of the FIFO were open: {listing!r}, expected 200 within 5 s"
            )
        for i, reply in enumerate(await asyncio.gather(*fifo_gets)):
            if not reply.is_json_4xx(400):
                problems.append(f"concurrent GET pipe #{i}: {reply!r}, expected 400 within 5 s")
        if fifo_rescue.release():
            problems.append(
                "the concurrent GETs left server threads blocked opening the FIFO (released by the test)"
            )

        listing = await get(f"{base}?path=")
        if listing.code == 200:
            kinds = {e["name"]: e["type"] for e in json.loads(listing.body)["entries"]}
            if (kinds.get("pipe"), kinds.get("sock")) != ("other", "other"):
                problems.append(f"the listing says {kinds}, expected pipe and sock of type 'other'")
        else:
            problems.append(f"listing: {listing!r}")

        put = await call(jp_fetch, *files(sid, "pipe"), method="PUT", body=b"data", timeout=5)
        if not put.is_json_4xx(400):
            problems.append(f"PUT onto the FIFO: {put!r}, expected 400")
        if not stat.S_ISFIFO(os.lstat(ws / "pipe").st_mode):
            problems.append("PUT onto the FIFO replaced it")
            os.unlink(ws / "pipe")
            sandbox_run(sandbox["engine_id"], "import os; os.mkfifo('pipe')")
            fifo_rescue.watch(ws / "pipe")

        # Leave three GETs of the FIFO behind: the server must not be stuck on them
        # when it shuts down (checked by fifo_rescue after the server's teardown).
        left = [asyncio.ensure_future(get(f"{base}/pipe")) for _ in range(3)]
        await asyncio.wait(left, timeout=5)
        finish_attack(attacker, loops=1)
    finally:
        client.close()
    assert not problems, "\n".join(problems)


# -- 5. a growing download ----------------------------------------------------------------

_APPEND = r"""
import time
stats["appended"] = 0
block = b"A" * 65536
with open("big.bin", "ab", buffering=0) as fh:
    ready()
    while running():
        stats["loops"] += 1
        if stats["appended"] < ARGS["cap"]:
            fh.write(block)
            stats["appended"] += len(block)
        time.sleep(0.001)
"""


@pytest.mark.timeout(120)
async def test_download_sends_what_it_announced(
    jp_serverapp: Any, jp_fetch: Any, sandbox: dict[str, str]
) -> None:
    """A download of a 30 MB file that the sandbox keeps appending to.

    The attack: the server announces the size it saw when it opened the file
    (Content-Length) and then reads to end of file; the file has grown meanwhile, so
    it has more to send than it announced (the response breaks, or a client that
    trusts the header is fed bytes that belong to the next response).

    Required: the body has exactly Content-Length bytes, and they are the file's
    first Content-Length bytes.
    """
    sid, ws = sandbox["id"], Path(sandbox["workspace"])
    sandbox_run(
        sandbox["engine_id"], "import os; open('big.bin', 'wb').write(os.urandom(1 << 20) * 30)"
    )
    big = ws / "big.bin"
    original = big.read_bytes()
    problems: list[str] = []
    try:
        attacker = start_attack(sandbox["engine_id"], _APPEND, cap=120 << 20)
        request = request_head(jp_serverapp, "GET", f"api/sandboxes/{sid}/files/big.bin")
        for i in range(3):
            reply = await asyncio.to_thread(raw_http, jp_serverapp, request, timeout=20)
            announced = reply.headers.get("content-length")
            if reply.code != 200 or announced is None:
                problems.append(f"download #{i}: {reply!r}")
                continue
            if len(reply.body) != int(announced):
                problems.append(
                    f"download #{i}: Content-Length {announced} but {len(reply.body)} body bytes"
                )
            elif reply.body[: len(original)] != original or reply.body[len(original) :].strip(b"A"):
                problems.append(
                    f"download #{i}: the body is not the file's first {announced} bytes"
                )
        stats = finish_attack(attacker, appended=1 << 20)
    finally:
        big.unlink(missing_ok=True)
    assert not problems, "\n".join(problems) + f"\nattacker {stats}"


# -- 6. bad input ---------------------------------------------------------------------------


async def test_content_length_not_a_number(
    jp_serverapp: Any, jp_fetch: Any, sandbox: dict[str, str]
) -> None:
    """``Content-Length: abc`` on an upload (sent raw: tornado's client would fix it).

    Required: 400 with a JSON message, no traceback, nothing written.
    """
    sid, ws = sandbox["id"], Path(sandbox["workspace"])
    request = request_head(
        jp_serverapp, "PUT", f"api/sandboxes/{sid}/files/cl.txt", "Content-Length: abc"
    )
    reply = await asyncio.to_thread(raw_http, jp_serverapp, request, (b"hello",))
    assert reply.is_json_4xx(400), f"Content-Length: abc -> {reply!r}, expected a 400 JSON message"
    assert workspace_leftovers(ws) == []


async def test_chunked_upload_over_the_limit(jp_fetch: Any, sandbox: dict[str, str]) -> None:
    """A chunked upload (no Content-Length) that passes ``max_upload_size`` (1 MiB here).

    The attack: without a Content-Length the size is only known while the body comes;
    the server must still stop at the limit and say so.

    Required: 413 with a JSON message (not a reset connection), nothing left behind.
    """
    sid, ws = sandbox["id"], Path(sandbox["workspace"])

    async def producer(write: Callable[[bytes], Any]) -> None:
        for _ in range(40):  # 2.5 MiB in 64 KiB chunks
            await write(b"x" * 65536)

    reply = await call(jp_fetch, *files(sid, "chunked.bin"), method="PUT", body_producer=producer)
    await asyncio.sleep(0.5)
    assert reply.is_json_4xx(413), (
        f"chunked 2.5 MiB upload, limit 1 MiB -> {reply!r}, expected a 413 JSON message"
    )
    assert workspace_leftovers(ws) == []


async def test_long_names_and_paths(jp_fetch: Any, sandbox: dict[str, str]) -> None:
    """A file name of 300 characters (NAME_MAX is 255) and a path of 5000 (PATH_MAX 4096).

    Required: 400 JSON messages; a message is shorter than 400 characters (long names
    are cut in messages); nothing created in the workspace (no folders made on the way
    to a path that cannot exist).
    """
    sid, ws = sandbox["id"], Path(sandbox["workspace"])
    long_name = "n" * 300
    long_path = "/".join(["abcdefghi"] * 500)  # 4999 characters
    problems: list[str] = []
    for what, path in (("300-character name", long_name), ("5000-character path", long_path)):
        for method in ("PUT", "GET"):
            kw: dict[str, Any] = {"method": method}
            if method == "PUT":
                kw["body"] = b"data"
            reply = await call(jp_fetch, *files(sid, path), **kw)
            if not reply.is_json_4xx(400):
                problems.append(f"{method} {what}: {reply!r}, expected a 400 JSON message")
            elif len(reply.message()) >= 400:
                problems.append(
                    f"{method} {what}: the message is {len(reply.message())} characters long"
                )
    leftovers = workspace_leftovers(ws)
    if leftovers:
        problems.append(
            f"left in the workspace: {len(leftovers)} entries, e.g. {leftovers[0][:80]!r}"
        )
    assert not problems, "\n".join(problems)


async def test_deeply_nested_json(jp_fetch: Any, sandbox: dict[str, str]) -> None:
    """A snapshot request whose body is ``[`` 100,000 times (JSON nested 100k deep).

    Required: 400 with a JSON message (a parser's recursion limit is a bad body, not
    a server error); nothing in the workspace.
    """
    sid, ws = sandbox["id"], Path(sandbox["workspace"])
    reply = await call(
        jp_fetch, "api", "sandboxes", sid, "snapshots", method="POST", body="[" * 100_000
    )
    assert reply.is_json_4xx(400), f"{reply!r}, expected a 400 JSON message"
    assert workspace_leftovers(ws) == []


async def test_aborted_upload_leaves_nothing(
    jp_serverapp: Any, jp_fetch: Any, sandbox: dict[str, str]
) -> None:
    """An upload the client abandons half-way (800 KB announced, 300 KB sent, closed).

    Required: no partial target and no temporary file in the workspace afterwards.
    """
    sid, ws = sandbox["id"], Path(sandbox["workspace"])
    request = request_head(
        jp_serverapp, "PUT", f"api/sandboxes/{sid}/files/way.bin", "Content-Length: 800000"
    )
    await asyncio.to_thread(raw_http, jp_serverapp, request, (b"y" * 150_000, b"y" * 150_000), True)
    deadline = time.monotonic() + 5
    while workspace_leftovers(ws) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert workspace_leftovers(ws) == []


# -- the same races through WebDAV -----------------------------------------------------


def dav(sid: str, path: str = "") -> tuple[str, ...]:
    return ("sandbox-kernel", "dav", sid, *([path] if path else []))


def secret_copies(workspace: Path) -> list[str]:
    """Files under the workspace (links not followed) whose bytes are the host secret."""
    found = []
    for folder, _dirs, names in os.walk(workspace):
        for name in names:
            path = Path(folder, name)
            kind, data = read_nofollow(path)
            if kind == "file" and SECRET in data:
                found.append(str(path.relative_to(workspace)))
    return found


def restore_d_and_x(ws: Path, host: Path) -> None:
    """After a removal of ``d`` took one of the two swapped names, put it back."""
    have = {name: os.path.lexists(ws / name) for name in ("d", "x")}
    if all(have.values()):
        return
    missing, other = ("d", "x") if not have["d"] else ("x", "d")
    if not have[other]:
        raise AssertionError("both d and x are gone (test bug)")
    # Made under a name the attacker does not touch, then renamed into place: once both
    # names exist again the exchange resumes at once, and a path through ``missing``
    # might already lead to the host folder.
    # Owned as the workspace is on the host: that is the owner the sandbox user has in its
    # (possibly idmapped) view. An owner the view does not map cannot be renamed in it,
    # which would stop the exchange for the rest of the phase.
    owner = os.stat(ws)
    stage = ws / ".restore"
    if os.path.islink(ws / other):
        stage.mkdir()
        (stage / "f").write_bytes(b"inside")
        os.chown(stage / "f", owner.st_uid, owner.st_gid)
        os.chown(stage, owner.st_uid, owner.st_gid)
    else:
        os.symlink(host, stage)
        os.lchown(stage, owner.st_uid, owner.st_gid)
    os.rename(stage, ws / missing)


DAV_TRIES = {"propfind": 100, "get": 100, "put": 60, "delete": 60, "copy": 60, "move": 60}
DAV_TRIES |= {"mkcol": 60, "rmtree": 40}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("operation", sorted(DAV_TRIES))
async def test_webdav_folder_swap_race(
    jp_fetch: Any,
    jp_serverapp: Any,
    sandbox: dict[str, str],
    secrets: HostSecrets,
    operation: str,
) -> None:
    """Every WebDAV method on ``d/...`` while the sandbox swaps ``d`` with a link out.

    The same attack as :func:`test_folder_swap_race` (``x`` -> the host folder, the two
    names exchanged atomically in a loop), through the WebDAV methods a desktop client
    uses: PROPFIND, GET, PUT, DELETE of a file and of a whole tree, COPY, MOVE, MKCOL.
    Required on every try: no answer carries HOST-SECRET or lists ``host-only.txt``, the
    host folder and secret stay as they were, no copy of the secret ever lands in the
    workspace, and no answer is a 5xx.
    """
    sid, ws = sandbox["id"], Path(sandbox["workspace"])
    sandbox_run(
        sandbox["engine_id"], _MAKE_D_AND_X, real="d", file="f", link="x", host=str(secrets.folder)
    )
    inside = os.open(ws / "d", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    problems: list[str] = []
    codes: dict[int, int] = {}
    raw = {"allow_nonstandard_methods": True}
    target = f"http://127.0.0.1:{jp_serverapp.port}{jp_serverapp.base_url}sandbox-kernel/dav/{sid}"
    try:
        attacker = start_attack(sandbox["engine_id"], EXCHANGE, a="d", b="x")
        saw_both(ws / "d")
        deadline = time.monotonic() + PHASE_SECONDS
        done = 0
        for i in range(DAV_TRIES[operation]):
            if time.monotonic() > deadline:
                break
            done += 1
            if operation in ("delete", "copy", "move") and "f" not in os.listdir(inside):
                fd = os.open("f", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=inside)
                os.write(fd, b"inside")
                os.close(fd)
            if operation == "propfind":
                reply = await call(
                    jp_fetch,
                    *dav(sid, "d/"),
                    method="PROPFIND",
                    body=b"",
                    headers={"Depth": "1"},
                    **raw,
                )
                if b"host-only.txt" in reply.body:
                    problems.append("a PROPFIND of d listed the host folder")
            elif operation == "get":
                reply = await call(jp_fetch, *dav(sid, "d/f"))
            elif operation == "put":
                reply = await call(jp_fetch, *dav(sid, f"d/new-{i}"), method="PUT", body=b"new")
            elif operation == "delete":
                reply = await call(jp_fetch, *dav(sid, "d/f"), method="DELETE")
            elif operation == "rmtree":
                reply = await call(jp_fetch, *dav(sid, "d"), method="DELETE")
            elif operation == "mkcol":
                reply = await call(
                    jp_fetch, *dav(sid, f"d/sub-{i}"), method="MKCOL", body=b"", **raw
                )
            else:
                reply = await call(
                    jp_fetch,
                    *dav(sid, "d/f"),
                    method=operation.upper(),
                    body=b"",
                    headers={"Destination": f"{target}/d/{operation}-{i}", "Overwrite": "T"},
                    **raw,
                )
            codes[reply.code] = codes.get(reply.code, 0) + 1
            if SECRET in reply.body:
                problems.append(f"{operation}: the answer carried HOST-SECRET")
            if reply.code >= 500:
                problems.append(f"{operation}: answer {reply!r}")
            found = secrets.problems()
            if found:
                problems.extend(f"{operation}: {text}" for text in found)
                secrets.restore()
            if operation == "rmtree":
                # A removal stops the exchange until both names exist again; the next
                # try waits until the host sees it running, so every try is raced.
                restore_d_and_x(ws, secrets.folder)
                saw_both(ws / "d")
        stats = finish_attack(attacker, swaps=1000)
    finally:
        os.close(inside)
    leaked = secret_copies(ws)
    if leaked:
        problems.append(f"{operation}: the host secret was copied into the workspace: {leaked}")
    print(f"{operation}: answers {codes} in {done} tries; attacker {stats}")
    assert not problems, f"{summary(problems)}\nanswers {codes} in {done} tries; attacker {stats}"
    assert done >= min(DAV_TRIES[operation], 30), f"too few tries in {PHASE_SECONDS} s: {codes}"
