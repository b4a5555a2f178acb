"""Shared fixtures: a real Docker engine and the locally built test image.

Tests marked ``docker`` need both. Without them they are skipped with the reason
shown in pytest's summary; with ``SANDBOX_KERNEL_REQUIRE_DOCKER=1`` (set by .ci/run)
a missing engine fails the run instead, so CI can never pass by skipping.
"""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox_kernel.config import SandboxConfig, load_config

pytest_plugins = ("pytest_jupyter.jupyter_server", "tests.local_host")

TEST_IMAGE = os.environ.get("SANDBOX_KERNEL_TEST_IMAGE", "sandbox-kernel-test:bookworm")


def _docker_problem() -> str | None:
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:
        return f"no Docker engine answers ({type(exc).__name__}); start dockerd or run .ci/run"
    try:
        client.images.get(TEST_IMAGE)
    except Exception:
        return f"test image {TEST_IMAGE} is missing; build it with .ci/build-test-image.sh"
    return None


def _kube_problem() -> str | None:
    """Why no Kubernetes cluster can be used here (None: one answers)."""
    from sandbox_kernel.backends.base import SandboxError
    from sandbox_kernel.backends.kubernetes.client import Api, load_config

    try:
        Api(load_config()).get("/version", what="ask its version")
    except SandboxError as exc:
        return f"no Kubernetes cluster answers ({exc}); .ci/kube-up.sh starts one (KUBECONFIG=its last line)"
    return None


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m fast`` alone, a test file that marks no test fast is not even imported:
    the fast layer's time is then its own tests', not the import of every engine's client."""
    if config.getoption("markexpr") != "fast" or not collection_path.name.startswith("test_"):
        return None
    if collection_path.suffix != ".py":
        return None
    return "mark.fast" not in collection_path.read_text() or None


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (Jupyter, the SDKs, pydantic: millions of objects) stays
    for the whole run: kept out of the garbage collector's full passes, which would
    otherwise walk it again and again (seconds of the fast layer)."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("kubernetes" in item.keywords for item in items):
        kube = _kube_problem()
        if kube is not None:
            if os.environ.get("SANDBOX_KERNEL_REQUIRE_KUBE") == "1":
                raise pytest.UsageError(
                    f"Kubernetes tests are required here but cannot run: {kube}"
                )
            for item in items:
                if "kubernetes" in item.keywords:
                    item.add_marker(pytest.mark.skip(reason=kube))
    if not any("docker" in item.keywords for item in items):
        return
    problem = _docker_problem()
    if problem is None:
        return
    if os.environ.get("SANDBOX_KERNEL_REQUIRE_DOCKER") == "1":
        raise pytest.UsageError(f"Docker tests are required here but cannot run: {problem}")
    skip = pytest.mark.skip(reason=problem)
    for item in items:
        if "docker" in item.keywords:
            item.add_marker(skip)


def require_bwrap() -> None:
    """For tests of bubblewrap isolation: skip with the reason where it cannot create
    namespaces, or fail with ``SANDBOX_KERNEL_REQUIRE_BWRAP=1`` (set by .ci/run), so CI
    never passes by skipping the isolation it claims to test."""
    from sandbox_kernel.backends.local import bwrap_works

    bwrap_works.cache_clear()
    if bwrap_works():
        return
    problem = "bubblewrap cannot create namespaces here (apt-get install bubblewrap; unprivileged user namespaces)"
    if os.environ.get("SANDBOX_KERNEL_REQUIRE_BWRAP") == "1":
        pytest.fail(f"bubblewrap tests are required here but cannot run: {problem}")
    pytest.skip(problem)


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No test may pick up the developer's own settings or sandboxes."""
    for name in list(os.environ):
        if name.startswith("SANDBOX_KERNEL_") and name not in (
            "SANDBOX_KERNEL_TEST_IMAGE",
            "SANDBOX_KERNEL_REQUIRE_DOCKER",
            "SANDBOX_KERNEL_REQUIRE_BWRAP",
            "SANDBOX_KERNEL_REQUIRE_HUB",
            "SANDBOX_KERNEL_REQUIRE_KUBE",
        ):
            monkeypatch.delenv(name)
    monkeypatch.delenv("JUPYTERHUB_USER", raising=False)
    monkeypatch.delenv("KERNEL_USERNAME", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "jupyter-config"))
    yield
    for name in ("SANDBOX_KERNEL_SERVER_ROOT", "SANDBOX_KERNEL_OWNER_FROM"):
        os.environ.pop(name, None)  # set by a server extension under test


@pytest.fixture(autouse=True)
def _leave_nothing_on_the_host(tmp_path: Path) -> Iterator[None]:
    """What this test's sandboxes hold on the host goes with the test, even when it
    removed containers itself or crashed: local sandboxes' holder processes (their
    namespaces) and cgroups, then idmapped workspace mounts and the disks mounted over
    workspaces (they outlive sandboxes, as workspaces do)."""
    yield
    if not any(tmp_path.iterdir()):  # the test made nothing here: nothing to release
        return
    from sandbox_kernel.backends import idmap
    from sandbox_kernel.backends.base import EngineSettings, installation_id
    from sandbox_kernel.backends.docker.mounts import remove_mount_folder
    from sandbox_kernel.backends.local import LocalBackend

    for state in {p.parent.parent.parent for p in tmp_path.glob("**/local/*/holder.json")}:
        settings = EngineSettings(installation_id(str(state)), str(tmp_path), str(state))
        LocalBackend(settings).end_all()
    for _source, target in idmap.mounts_of(tmp_path):
        idmap.unmount(Path(target))
        remove_mount_folder(Path(target).parent)
    release_disks(tmp_path)


@pytest.fixture(scope="session", autouse=True)
def _release_disks_at_the_end(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The disks of workspaces made by module-wide fixtures (a kernel environment shared
    by a module's tests) go at the end of the run, so pytest can remove their folders."""
    yield
    release_disks(tmp_path_factory.getbasetemp())


def release_disks(folder: Path) -> None:
    """Unmount every disk image kept or mounted beneath ``folder`` (workspaces' disks),
    wherever it is mounted (idmapped views of it live in /run)."""
    from sandbox_kernel.backends import disks
    from sandbox_kernel.backends.docker.mounts import remove_mount_folder

    for target in disks.release_beneath(folder):
        if target.startswith("/run/sandbox-kernel/"):
            remove_mount_folder(Path(target).parent)


@pytest.fixture
def test_user() -> str:
    """A user name no other test (or person) uses, so cleanup can find what we made."""
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[..., SandboxConfig]:
    """Settings for a docker test: the test image, and a workspace root under tmp_path."""

    def make(**overrides: object) -> SandboxConfig:
        values: dict[str, object] = {
            "backend": "docker",
            "image": TEST_IMAGE,
            "workspace_root": str(tmp_path / "workspaces"),
            "state_dir": str(tmp_path / "state"),
        }
        values.update(overrides)
        return load_config(environ={}, **values)

    return make


def remove_user_snapshots(user_id_prefix: str) -> None:
    """Remove every snapshot image whose sandbox-kernel user starts with the prefix.

    By label, not by tag: tags carry the installation and change with it.
    """
    import docker

    client = docker.from_env()
    for image in client.images.list(filters={"label": "sandbox-kernel.snapshot"}):
        if (image.labels or {}).get("sandbox-kernel.user", "").startswith(user_id_prefix):
            client.images.remove(image.id, force=True)


def remove_user_containers(user_id_prefix: str, client: object = None) -> None:
    """Remove every container whose sandbox-kernel user id starts with the prefix."""
    import docker

    from sandbox_kernel.backends import idmap
    from sandbox_kernel.backends.docker.mounts import remove_mount_folder

    client = client or docker.from_env()
    for container in client.containers.list(
        ignore_removed=True, all=True, filters={"label": "sandbox-kernel.managed=1"}
    ):
        if container.labels.get("sandbox-kernel.user-id", "").startswith(user_id_prefix):
            container.remove(force=True)
            mount = container.labels.get("sandbox-kernel.workspace-mount")
            if mount:  # removed behind the backend's back: its idmapped mount too
                idmap.unmount(Path(mount))
                remove_mount_folder(Path(mount).parent)


def sandbox_container(sandbox_id: str, client: object = None) -> object:
    """The Docker container of a sandbox id: its engine name is the id plus the
    installation's tag (``sk-alice--i1a2b3c4d``), so tests find it by that prefix."""
    import re

    import docker

    client = client or docker.from_env()
    found = client.containers.list(
        ignore_removed=True, all=True, filters={"name": f"^/{re.escape(sandbox_id)}--i[0-9a-f]+$"}
    )
    assert len(found) == 1, (
        f"expected one container for {sandbox_id}, found {[c.name for c in found]}"
    )
    return found[0]


@pytest.fixture
def docker_cleanup(test_user: str) -> Iterator[None]:
    import docker

    client = docker.from_env()  # made now: a test may point DOCKER_HOST elsewhere
    yield
    remove_user_containers(test_user, client)


@pytest.fixture
def rest_env(
    tmp_path: Path, test_user: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, str]]:
    """The environment of a Jupyter server under test: Docker, the test image, folders
    under tmp_path, the test's user; its sandboxes are removed afterwards."""
    env = {
        "SANDBOX_KERNEL_BACKEND": "docker",
        "SANDBOX_KERNEL_IMAGE": TEST_IMAGE,
        "SANDBOX_KERNEL_WORKSPACE_ROOT": str(tmp_path / "ws"),
        "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_KERNEL_USER": test_user,
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    yield env
    remove_user_containers(test_user)


@pytest.fixture
def sandbox(
    rest_env: dict[str, str], make_config: Callable[..., SandboxConfig], test_user: str
) -> dict[str, str]:
    """A sandbox of the server's user, made the way a kernel makes it (``engine_id`` is
    its container, for tests that reach into it with the docker SDK)."""
    from sandbox_kernel.identity import ScopeKey
    from sandbox_kernel.service import SandboxService

    cfg = make_config(
        workspace_root=rest_env["SANDBOX_KERNEL_WORKSPACE_ROOT"],
        state_dir=rest_env["SANDBOX_KERNEL_STATE_DIR"],
    )
    info = SandboxService(cfg).ensure(ScopeKey(test_user)).info
    return {"id": info.id, "workspace": info.workspace, "engine_id": info.engine_id}


@pytest.fixture(scope="session")
def kube_namespace() -> Iterator[str]:
    """A namespace of this test session's own on the test cluster, removed (with every
    pod, claim and policy in it) at the end."""
    from sandbox_kernel.backends.kubernetes.client import Api, load_config

    api = Api(load_config())
    name = f"sk-test-{uuid.uuid4().hex[:8]}"
    api.post(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    yield name
    api.delete(f"/api/v1/namespaces/{name}")
