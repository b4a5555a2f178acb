"""The kubernetes backend on a real cluster (.ci/kube-up.sh: apiserver, controller-manager,
scheduler, a kubelet on containerd, kube-proxy, kube-network-policies enforcing
NetworkPolicy, hostPath volumes), through our own client; what it made is checked with
the official ``kubernetes`` client. Each session works in a namespace of its own.

Covered here: the pods' hardening and objects, stop/start/destroy and what survives
each, races, processes, the kernel (conformance suite, restarts), the CLI, the
lifecycle, and the hostile cell (other users' pods, the API server's credentials, the
kubelet, the metadata address). REST, WebDAV, terminals and MCP are in
test_kubernetes_doors.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.manager import start_new_kernel

from sandbox_kernel.backends.base import NotSupported, SandboxError, SandboxNotFound
from sandbox_kernel.config import SandboxConfig
from sandbox_kernel.identity import ScopeKey
from sandbox_kernel.lifecycle import gc
from sandbox_kernel.service import SandboxService

from .conftest import TEST_IMAGE
from .kernel_env import ConformanceSuite, KernelEnv, make_kernel_env
from .test_kernel import run, text_of

pytestmark = pytest.mark.kubernetes
SECONDS = 1 / 60  # lifecycle settings are minutes


def core() -> Any:
    """The official client's CoreV1Api, on the same KUBECONFIG."""
    from kubernetes import client, config

    config.load_kube_config()
    return client.CoreV1Api()


def networking() -> Any:
    from kubernetes import client, config

    config.load_kube_config()
    return client.NetworkingV1Api()


def kube_settings(namespace: str, **extra: str) -> dict[str, str]:
    return {
        "SANDBOX_KERNEL_BACKEND": "kubernetes",
        "SANDBOX_KERNEL_KUBERNETES_NAMESPACE": namespace,
        "SANDBOX_KERNEL_IMAGE": TEST_IMAGE,
        **extra,
    }


@pytest.fixture
def service_for(
    make_config: Callable[..., SandboxConfig], kube_namespace: str
) -> Callable[..., SandboxService]:
    def make(**overrides: Any) -> SandboxService:
        return SandboxService(
            make_config(backend="kubernetes", kubernetes_namespace=kube_namespace, **overrides)
        )

    return make


def sh(service: SandboxService, sandbox_id: str, script: str) -> str:
    result = service.backend.exec(sandbox_id, ["sh", "-c", script])
    assert result.exit_code == 0, result.output
    return result.output.decode()


def pod_of(namespace: str, sandbox_id: str) -> Any:
    (pod,) = [
        p
        for p in core().list_namespaced_pod(namespace).items
        if (p.metadata.annotations or {}).get("sandbox-kernel/id") == sandbox_id
    ]
    return pod


def claims_of(namespace: str, user_id: str) -> dict[str, str]:
    """{claim name: role} of one user's claims (a removed claim waits for its pod to end
    before it goes: it no longer counts)."""
    found = core().list_namespaced_persistent_volume_claim(
        namespace, label_selector=f"sandbox-kernel.user-id={user_id}"
    )
    return {
        c.metadata.name: c.metadata.labels["sandbox-kernel.role"]
        for c in found.items
        if c.metadata.deletion_timestamp is None
    }


def user() -> str:
    return f"u{uuid.uuid4().hex[:8]}"


# -- the objects -----------------------------------------------------------------------
def test_a_sandbox_is_a_hardened_pod_with_claims_and_a_policy(
    service_for: Callable[..., SandboxService], kube_namespace: str
) -> None:
    name = user()
    service = service_for(flavor="medium")
    ensured = service.ensure(ScopeKey(name))
    info = ensured.info
    assert (ensured.event, info.state, info.backend) == ("created", "running", "kubernetes")
    pod = pod_of(kube_namespace, info.id)
    spec = pod.spec
    assert spec.automount_service_account_token is False
    assert spec.enable_service_links is False
    assert spec.security_context.run_as_non_root is True
    assert spec.security_context.run_as_user == 1000
    assert spec.security_context.seccomp_profile.type == "RuntimeDefault"
    (container,) = spec.containers
    assert container.security_context.allow_privilege_escalation is False
    assert container.security_context.capabilities.drop == ["ALL"]
    assert container.resources.limits == {
        "cpu": "2",
        "memory": "2Gi",
        "ephemeral-storage": "20Gi",
    }
    assert {m.mount_path for m in container.volume_mounts} == {"/workspace", "/home/sandbox"}
    roles = claims_of(kube_namespace, ScopeKey(name).user_id)
    assert sorted(roles.values()) == ["sandbox", "workspace"]
    (policy,) = [
        p
        for p in networking().list_namespaced_network_policy(kube_namespace).items
        if p.metadata.name == pod.metadata.name
    ]
    assert policy.spec.policy_types == ["Ingress", "Egress"] and not policy.spec.ingress
    blocked = policy.spec.egress[0].to[0].ip_block
    assert blocked.cidr == "0.0.0.0/0" and "169.254.0.0/16" in blocked._except
    # Inside: not root, no capability, no privilege to gain, no account token.
    status = sh(
        service, info.id, "id -u; grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status"
    )
    assert status.split() == [
        "1000",
        "CapEff:",
        "0000000000000000",
        "NoNewPrivs:",
        "1",
        "Seccomp:",
        "2",
    ]
    assert "none" in sh(
        service, info.id, "ls /var/run/secrets/kubernetes.io 2>/dev/null || echo none"
    )
    assert service.ensure(ScopeKey(name)).event == "existing"
    assert [i.id for i in service.backend.list(name)] == [info.id]


def test_stop_keeps_the_claims_and_start_brings_home_and_workspace_back(
    service_for: Callable[..., SandboxService], kube_namespace: str
) -> None:
    name = user()
    service = service_for()
    backend = service.backend
    info = service.ensure(ScopeKey(name)).info
    sh(
        service,
        info.id,
        "echo work > /workspace/w.txt; mkdir -p ~/.local/lib; echo pkg > ~/.local/lib/p.txt",
    )
    stopped = backend.stop(info.id)
    assert stopped.state == "stopped" and stopped.finished > 0
    assert not [
        p
        for p in core().list_namespaced_pod(kube_namespace).items
        if (p.metadata.annotations or {}).get("sandbox-kernel/id") == info.id
    ]
    assert len(claims_of(kube_namespace, ScopeKey(name).user_id)) == 2
    with pytest.raises(SandboxError, match="is stopped"):
        backend.exec(info.id, ["true"])
    again = service.ensure(ScopeKey(name))
    assert again.event == "started" and again.info.engine_id == info.engine_id
    assert sh(service, info.id, "cat /workspace/w.txt ~/.local/lib/p.txt") == "work\npkg\n"


def test_destroy_keeps_the_workspace_only(
    service_for: Callable[..., SandboxService], kube_namespace: str
) -> None:
    name = user()
    service = service_for()
    backend = service.backend
    info = service.ensure(ScopeKey(name)).info
    sh(service, info.id, "echo precious > /workspace/data.txt; echo gone > ~/outside.txt")
    assert backend.destroy(info.id) is True
    assert backend.destroy(info.id) is False
    with pytest.raises(SandboxNotFound):
        backend.get(info.id)
    assert sorted(claims_of(kube_namespace, ScopeKey(name).user_id).values()) == ["workspace"]
    again = service.ensure(ScopeKey(name))
    assert again.event == "recreated" and "variables were lost" in again.notice
    assert sh(
        service, info.id, "cat /workspace/data.txt; ls ~/outside.txt 2>/dev/null || echo none"
    ) == ("precious\nnone\n")


def test_concurrent_first_use_makes_one_pod(
    service_for: Callable[..., SandboxService], kube_namespace: str
) -> None:
    name = user()
    results: list[str] = []
    errors: list[BaseException] = []

    def first() -> None:
        try:
            results.append(service_for().ensure(ScopeKey(name)).info.engine_id)
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=first) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(results)) == 1
    pods = [
        p
        for p in core().list_namespaced_pod(kube_namespace).items
        if (p.metadata.labels or {}).get("sandbox-kernel.user-id") == ScopeKey(name).user_id
    ]
    assert len(pods) == 1


def test_thread_sandboxes_share_the_users_workspace(
    service_for: Callable[..., SandboxService],
) -> None:
    name = user()
    service = service_for(scope="thread")
    one = service.ensure(ScopeKey(name, "thread", "one.ipynb")).info
    two = service.ensure(ScopeKey(name, "thread", "two.ipynb")).info
    assert one.id != two.id
    sh(service, one.id, "echo from-one > /workspace/shared.txt; echo mine > ~/home.txt")
    assert sh(
        service, two.id, "cat /workspace/shared.txt; cat ~/home.txt 2>/dev/null || echo own-home"
    ) == ("from-one\nown-home\n")


def test_processes_exit_codes_folders_variables_and_limits(
    service_for: Callable[..., SandboxService],
) -> None:
    service = service_for()
    backend = service.backend
    info = service.ensure(ScopeKey(user())).info
    result = backend.exec(info.id, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.exit_code, sorted(result.output.split())) == (3, [b"err", b"out"])
    result = backend.exec(
        info.id, ["sh", "-c", "pwd; echo $GREETING"], cwd="/tmp", env={"GREETING": "hi"}
    )
    assert result.output == b"/tmp\nhi\n"
    missing = backend.exec(info.id, ["no-such-program"])
    assert missing.exit_code in (126, 127) and b"no-such-program" in missing.output
    slow = backend.exec(info.id, ["sleep", "60"], timeout=1)
    assert slow.exit_code == 124
    blob = os.urandom(3 << 20)
    backend.put_file(info.id, "deep/blob.bin", blob)
    assert b"".join(backend.get_file(info.id, "deep/blob.bin")) == blob
    with pytest.raises(SandboxError):
        b"".join(backend.get_file(info.id, "missing.bin"))
    usage = backend.usage([info])[info.id]
    assert 0 < usage["memory"] < 1 << 30 and usage["cpu_seconds"] >= 0


def test_snapshots_say_why_not(service_for: Callable[..., SandboxService]) -> None:
    service = service_for()
    info = service.ensure(ScopeKey(user())).info
    with pytest.raises(NotSupported, match="VolumeSnapshot"):
        service.create_snapshot(info.user, info.id, "base")


def test_not_ours_is_never_touched(
    service_for: Callable[..., SandboxService], kube_namespace: str
) -> None:
    from kubernetes import client

    name = user()
    service = service_for()
    from sandbox_kernel.backends.kubernetes import objects

    claim = objects.home_claim(objects.object_name(service.installation, ScopeKey(name).name))
    core().create_namespaced_persistent_volume_claim(
        kube_namespace,
        client.V1PersistentVolumeClaim(
            metadata=client.V1ObjectMeta(name=claim),
            spec=client.V1PersistentVolumeClaimSpec(
                access_modes=["ReadWriteOnce"],
                resources=client.V1VolumeResourceRequirements(requests={"storage": "1Mi"}),
            ),
        ),
    )
    with pytest.raises(SandboxError, match="not made by this sandbox-kernel installation"):
        service.ensure(ScopeKey(name))
    assert all(i.user != name for i in service.backend.list())


def test_bad_cluster_settings_say_what_to_do(
    service_for: Callable[..., SandboxService], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    health = service_for().backend.health()
    assert not health.ok and "KUBECONFIG" in health.message
    with pytest.raises(SandboxError, match="KUBECONFIG"):
        service_for().ensure(ScopeKey(user()))


# -- lifecycle -------------------------------------------------------------------------
def test_idle_stop_then_delete_keeps_the_workspace(
    service_for: Callable[..., SandboxService], kube_namespace: str
) -> None:
    name = user()
    service = service_for(idle_stop=1 * SECONDS, idle_delete=1 * SECONDS)
    backend = service.backend
    info = service.ensure(ScopeKey(name)).info
    sh(service, info.id, "echo k > /workspace/keep.txt")
    assert [a for a in gc(backend, service.config) if a.sandbox_id == info.id] == []
    time.sleep(1.5)
    [action] = [a for a in gc(backend, service.config) if a.sandbox_id == info.id]
    assert (action.action, action.done) == ("stop", True)
    assert backend.get(info.id).state == "stopped"
    time.sleep(1.5)
    [action] = [a for a in gc(backend, service.config) if a.sandbox_id == info.id]
    assert (action.action, action.done) == ("destroy", True)
    with pytest.raises(SandboxNotFound):
        backend.get(info.id)
    assert sorted(claims_of(kube_namespace, ScopeKey(name).user_id).values()) == ["workspace"]
    again = service.ensure(ScopeKey(name)).info
    assert sh(service, again.id, "cat /workspace/keep.txt") == "k\n"


def test_orphans_are_reaped_and_other_installations_left_alone(
    service_for: Callable[..., SandboxService], tmp_path: Path
) -> None:
    name = user()
    service = service_for(orphan_grace=1 * SECONDS)
    info = service.ensure(ScopeKey(name)).info
    other = service_for(state_dir=str(tmp_path / "other-state"), orphan_grace=1 * SECONDS)
    assert all(i.id != info.id for i in other.backend.list())  # not theirs to see
    service.store.delete(service.backend.name, info.id)  # its owner record is lost
    time.sleep(1.5)
    assert [a for a in gc(other.backend, other.config) if a.sandbox_id == info.id] == []
    actions = [a for a in gc(service.backend, service.config) if a.sandbox_id == info.id]
    assert [(a.action, a.done) for a in actions] == [("destroy", True)]
    assert service.backend.find(info.id) is None


# -- the kernel ------------------------------------------------------------------------
class TestKubernetesConformance(ConformanceSuite):
    """The official kernel conformance suite, with the kernel in a pod."""

    __test__ = True

    @classmethod
    def settings(cls, root: Path) -> dict[str, str]:
        from sandbox_kernel.backends.kubernetes.client import Api, load_config

        cls.namespace = f"sk-test-{uuid.uuid4().hex[:8]}"
        Api(load_config()).post(
            "/api/v1/namespaces", {"metadata": {"name": cls.namespace}}, what="make a namespace"
        )
        return kube_settings(cls.namespace)

    @classmethod
    def clean_up(cls) -> None:
        from sandbox_kernel.backends.kubernetes.client import Api, load_config

        Api(load_config()).delete(f"/api/v1/namespaces/{cls.namespace}")

    def test_runs_in_a_pod(self) -> None:
        self.flush_channels()
        reply, outputs = run(
            self.kc, "import socket, os; print(socket.gethostname(), os.getuid(), os.getcwd())"
        )
        assert reply["status"] == "ok"
        assert text_of(outputs).split() == ["sandbox", "1000", "/workspace"]


@pytest.fixture
def kkenv(tmp_path: Path, kube_namespace: str, monkeypatch: pytest.MonkeyPatch) -> KernelEnv:
    env = make_kernel_env(tmp_path, **kube_settings(kube_namespace))
    monkeypatch.setenv("JUPYTER_PATH", env.jupyter_path)
    return env


def test_kernel_restart_keeps_files_and_packages_not_variables(
    kkenv: KernelEnv, kube_namespace: str
) -> None:
    from .helpers import make_wheel

    km, kc = start_new_kernel(kernel_name="sandbox", startup_timeout=180)
    try:
        wheel = make_wheel(Path(tempfile.mkdtemp()), "sk_kube_pkg")
        reply, _ = run(kc, "x = 41\nopen('/workspace/kept.txt', 'w').write('workspace')")
        assert reply["status"] == "ok", reply
        # A package installed with pip --user, as a user would (the wheel sent in first).
        service = SandboxService(
            kkenv.config(backend="kubernetes", kubernetes_namespace=kube_namespace)
        )
        sid = service.backend.list(kkenv.user)[0].id
        service.backend.put_file(sid, f"/tmp/{wheel.name}", wheel.read_bytes())
        done = service.backend.exec(
            sid, ["python3", "-m", "pip", "install", "--user", "--no-index", f"/tmp/{wheel.name}"]
        )
        assert done.exit_code == 0, done.output[-1000:]
        km.restart_kernel(now=True)
        kc.wait_for_ready(timeout=180)
        reply, outputs = run(
            kc,
            "import sk_kube_pkg\n"
            "print(open('/workspace/kept.txt').read(), sk_kube_pkg.VALUE, 'x' in globals())",
        )
        assert reply["status"] == "ok", reply
        assert text_of(outputs).split() == ["workspace", "1.0", "False"]
        # Stopped and started again (a new pod): the package is still there.
        service.backend.stop(sid)
        reply, outputs = run(kc, "print('after the stop')")
        assert reply["status"] == "error" or "restarted" in text_of(outputs, "stderr")
        reply, outputs = run(kc, "import sk_kube_pkg; print(sk_kube_pkg.VALUE)")
        assert reply["status"] == "ok", reply
        assert text_of(outputs) == "1.0\n"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_interrupt_keeps_variables(kkenv: KernelEnv) -> None:
    km, kc = start_new_kernel(kernel_name="sandbox", startup_timeout=180)
    try:
        assert run(kc, "y = 'still here'")[0]["status"] == "ok"
        msg_id = kc.execute("import time; time.sleep(60)")
        time.sleep(2)
        km.interrupt_kernel()
        while True:
            reply = kc.get_shell_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        reply, outputs = run(kc, "print(y)")
        assert (reply["status"], text_of(outputs)) == ("ok", "still here\n"), (reply, outputs)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


# -- the CLI ---------------------------------------------------------------------------
def test_cli_on_the_cluster(tmp_path: Path, kube_namespace: str) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")},
        **kube_settings(kube_namespace),
        "SANDBOX_KERNEL_STATE_DIR": str(tmp_path / "state"),
        "SANDBOX_KERNEL_USER": user(),
    }

    def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "sandbox_kernel.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if ok:
            assert done.returncode == 0, done.stderr
        return done

    assert cli("exec", "--", "sh", "-c", "echo hi from $(hostname)").stdout == "hi from sandbox\n"
    (item,) = json.loads(cli("list", "--json").stdout)
    assert (item["backend"], item["state"]) == ("kubernetes", "running")
    cli("stop", item["id"])
    assert json.loads(cli("list", "--json").stdout)[0]["state"] == "stopped"
    cli("start", item["id"])
    stats = cli("stats").stdout
    assert "1" in stats
    failed = cli("exec", "--", "sh", "-c", "exit 7", ok=False)
    assert failed.returncode == 7
    cli("destroy", item["id"])
    assert json.loads(cli("list", "--json").stdout) == []


# -- the hostile cell ------------------------------------------------------------------
SERVE = (
    "import http.server, threading\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(b'secret of the owner')\n"
    "    def log_message(self, *a): pass\n"
    "s = http.server.HTTPServer(('0.0.0.0', 8080), H)\n"
    "threading.Thread(target=s.serve_forever, daemon=True).start()\n"
)
PROBE = (
    "import sys, urllib.request, ssl\n"
    "ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE\n"
    "try:\n"
    "    with urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2]), context=ctx) as r:\n"
    "        print('READ', r.status, r.read()[:100])\n"
    "except urllib.error.HTTPError as e:\n"
    "    print('REFUSED', e.code)\n"
    "except Exception as e:\n"
    "    print('UNREACHABLE', type(e).__name__)\n"
)


def probe(service: SandboxService, sandbox_id: str, url: str, timeout: float = 5) -> str:
    result = service.backend.exec(sandbox_id, ["python3", "-c", PROBE, url, str(timeout)])
    return result.output.decode().strip()


def pod_ip(namespace: str, sandbox_id: str) -> str:
    return str(pod_of(namespace, sandbox_id).status.pod_ip)


@pytest.fixture
def plain_pods(kube_namespace: str) -> Iterator[Callable[[str], str]]:
    """Pods without any policy of ours (the control): made from the test image, each
    serving the same page; gives their IPs."""
    from kubernetes import client

    api = core()
    made: list[str] = []

    def make(name: str) -> str:
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels={"test": "plain"}),
            spec=client.V1PodSpec(
                automount_service_account_token=False,
                security_context=client.V1PodSecurityContext(
                    run_as_user=1000, run_as_non_root=True
                ),
                containers=[
                    client.V1Container(
                        name="c",
                        image=TEST_IMAGE,
                        command=["python3", "-c", SERVE + "import time; time.sleep(3600)"],
                    )
                ],
            ),
        )
        api.create_namespaced_pod(kube_namespace, pod)
        made.append(name)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            found = api.read_namespaced_pod(name, kube_namespace)
            if found.status.phase == "Running" and found.status.pod_ip:
                return str(found.status.pod_ip)
            time.sleep(0.2)
        raise AssertionError(f"plain pod {name} did not run")

    yield make
    for name in made:
        api.delete_namespaced_pod(name, kube_namespace, grace_period_seconds=0)


def exec_in_plain(namespace: str, pod: str, *cmd: str) -> str:
    from kubernetes.stream import stream

    return str(
        stream(
            core().connect_get_namespaced_pod_exec,
            pod,
            namespace,
            command=list(cmd),
            stderr=True,
            stdin=False,
            stdout=True,
            tty=False,
        )
    ).strip()


def test_a_cell_cannot_reach_another_users_pod(
    service_for: Callable[..., SandboxService],
    kube_namespace: str,
    plain_pods: Callable[[str], str],
) -> None:
    """With the policy enforced: the victim's pod takes no connection from anyone, and the
    attacker's reaches no pod; the control (two pods without policy) shows the same
    requests succeed where no policy stands in the way."""
    service = service_for()
    victim = service.ensure(ScopeKey(user())).info
    attacker = service.ensure(ScopeKey(user())).info
    server = service.backend.open_channel(
        victim.id,
        ["python3", "-c", SERVE + "import sys; print('serving', flush=True); sys.stdin.read()"],
    )
    try:
        assert server.read().startswith(b"serving")
        one, two = (f"plain-{uuid.uuid4().hex[:6]}" for _ in range(2))
        one_ip = plain_pods(one)
        plain_pods(two)
        victim_ip = pod_ip(kube_namespace, victim.id)
        # The control: between pods without policy, the request goes through.
        assert "READ 200" in exec_in_plain(
            kube_namespace, two, "python3", "-c", PROBE, f"http://{one_ip}:8080/", "5"
        )
        # The victim's server answers inside its own pod...
        assert "READ 200" in probe(service, victim.id, "http://127.0.0.1:8080/")
        # ...and to no other pod: neither a policy-free one nor the attacker's.
        assert "UNREACHABLE" in exec_in_plain(
            kube_namespace, two, "python3", "-c", PROBE, f"http://{victim_ip}:8080/", "3"
        )
        assert "UNREACHABLE" in probe(service, attacker.id, f"http://{victim_ip}:8080/", 3)
        # Nor does the attacker reach any pod at all.
        assert "UNREACHABLE" in probe(service, attacker.id, f"http://{one_ip}:8080/", 3)
    finally:
        server.close()


def test_a_cell_has_no_credentials_for_the_api_server_or_the_kubelet(
    service_for: Callable[..., SandboxService],
) -> None:
    """No token to read; the API server, its service address and the node's kubelet are
    out of the network's reach wherever they lie in private or local space (as on the
    test cluster, whose node is 192.0.2.2), and refuse an anonymous caller elsewhere."""
    import ipaddress

    from sandbox_kernel.agent.egress_rules import INNER

    service = service_for()
    info = service.ensure(ScopeKey(user())).info
    # No token of any account anywhere a cell could read one.
    assert (
        sh(service, info.id, "ls /var/run/secrets /run/secrets 2>&1 || true").count("No such") == 2
    )
    from sandbox_kernel.backends.kubernetes.client import load_config

    server = load_config().server
    node = server.split("//")[1].rsplit(":", 1)[0]
    for url in (
        f"{server}/api/v1/namespaces/default/secrets",
        "https://10.96.0.1:443/api/v1/pods",
        f"https://{node}:10250/pods",
    ):
        seen = probe(service, info.id, url)
        try:
            address = ipaddress.ip_address(url.split("//")[1].split("/")[0].rsplit(":", 1)[0])
        except ValueError:  # a name: wherever it points, no credentials
            assert seen.startswith(("REFUSED 401", "REFUSED 403", "UNREACHABLE")), (url, seen)
            continue
        if any(address.version == s.version and address in s for s in INNER):
            assert seen.startswith("UNREACHABLE"), (url, seen)
        else:
            assert seen.startswith(("REFUSED 401", "REFUSED 403")), (url, seen)


def test_a_cell_cannot_reach_the_metadata_address(
    service_for: Callable[..., SandboxService],
) -> None:
    service = service_for()
    info = service.ensure(ScopeKey(user())).info
    assert probe(service, info.id, "http://169.254.169.254/latest/meta-data/", 3).startswith(
        "UNREACHABLE"
    )


def test_an_egress_allowlist_is_the_pods_whole_way_out(
    service_for: Callable[..., SandboxService],
    kube_namespace: str,
    plain_pods: Callable[[str], str],
) -> None:
    """With ``egress_allow`` the policy opens the listed network on the listed port and
    nothing else (another pod of the same network stays out of reach); a listed name,
    which a network policy cannot hold, is named in the listing."""
    listed, other = (f"plain-{uuid.uuid4().hex[:6]}" for _ in range(2))
    listed_ip, other_ip = plain_pods(listed), plain_pods(other)
    service = service_for(egress_allow=[f"{listed_ip}/32:8080", "pypi.org"])
    info = service.ensure(ScopeKey(user())).info
    assert "READ 200" in probe(service, info.id, f"http://{listed_ip}:8080/")
    assert probe(service, info.id, f"http://{other_ip}:8080/", 3).startswith("UNREACHABLE")
    assert "not held: pypi.org: a name" in service.backend.get(info.id).isolation


def test_without_network_nothing_leaves_the_pod(
    service_for: Callable[..., SandboxService],
    kube_namespace: str,
    plain_pods: Callable[[str], str],
) -> None:
    service = service_for(network=False)
    info = service.ensure(ScopeKey(user())).info
    target = plain_pods(f"plain-{uuid.uuid4().hex[:6]}")
    assert probe(service, info.id, f"http://{target}:8080/", 3).startswith("UNREACHABLE")


def test_notebook_folder_is_copied_in_and_changes_come_back(
    tmp_path: Path, kube_namespace: str
) -> None:
    """No host folder reaches a pod: `jupyter execute` of a notebook in a checkout still
    reads the data beside it (copied in at start) and leaves its result beside it (copied
    back at shutdown)."""
    import nbformat

    env = make_kernel_env(
        tmp_path / "k", **kube_settings(kube_namespace, SANDBOX_KERNEL_WORK_ROOT="auto")
    )
    folder = tmp_path / "checkout" / "nb"
    folder.mkdir(parents=True)
    (folder / "data.csv").write_text("a,1\nb,2\n")
    (folder / ".secret").write_text("never copied")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "import os\nrows = open('data.csv').read().splitlines()\n"
            "open('out.csv', 'w').write(str(len(rows)))\nprint(sorted(os.listdir('.')))"
        )
    ]
    nbformat.write(nb, folder / "report.ipynb")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter",
            "execute",
            "--inplace",
            "--kernel_name=sandbox",
            "report.ipynb",
        ],
        cwd=folder,
        env={**env.environ(), "JUPYTER_PATH": env.jupyter_path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (out,) = [
        o
        for o in nbformat.read(folder / "report.ipynb", as_version=4).cells[0].outputs
        if o.get("name") == "stdout"
    ]
    assert out["text"] == "['data.csv', 'out.csv', 'report.ipynb']\n"
    assert (folder / "out.csv").read_text() == "2"


def test_mapped_folders_are_claims_by_name(
    service_for: Callable[..., SandboxService], kube_namespace: str, tmp_path: Path
) -> None:
    """c.SandboxConfig.volumes names claims of the namespace: shared writable between users
    where mapped rw, unwritable where ro; a host folder or a missing claim is one line."""
    from kubernetes import client

    shared = f"team-{uuid.uuid4().hex[:6]}"
    core().create_namespaced_persistent_volume_claim(
        kube_namespace,
        client.V1PersistentVolumeClaim(
            metadata=client.V1ObjectMeta(name=shared),
            spec=client.V1PersistentVolumeClaimSpec(
                access_modes=["ReadWriteOnce"],
                resources=client.V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
            ),
        ),
    )
    writer = service_for(volumes=[f"{shared}:/team:rw"])
    one = writer.ensure(ScopeKey(user())).info
    sh(writer, one.id, "echo from-one > /team/note.txt")
    reader = service_for(volumes=[f"{shared}:/team"], scope="thread")
    two = reader.ensure(ScopeKey(user(), "thread", "r.ipynb")).info
    assert sh(reader, two.id, "cat /team/note.txt") == "from-one\n"
    refused = reader.backend.exec(two.id, ["sh", "-c", "echo x > /team/other.txt"])
    assert refused.exit_code != 0 and b"Read-only file system" in refused.output
    with pytest.raises(SandboxError, match="mounts claims by name"):
        (tmp_path / "data").mkdir()
        service_for(volumes=[f"{tmp_path / 'data'}:/data"]).ensure(ScopeKey(user()))
    with pytest.raises(SandboxError, match="has no claim named 'nowhere'"):
        service_for(volumes=["nowhere:/data"]).ensure(ScopeKey(user()))
