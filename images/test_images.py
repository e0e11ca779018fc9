"""Runs Sluice's two container images with Podman the way the Helm chart runs them in a cluster: as the
image's own user, read-only root filesystem with nothing writable added, every capability dropped, no
privilege escalation. What a user's cluster would do with them is checked from outside the container
(the process's UID and capabilities in /proc, the image's files), since the images hold no shell.

Run: python3 images/test_images.py   (`make image-test` runs it after `make images`)

Environment: OPERATOR_IMAGE, SIDECAR_IMAGE (the images to test; default the tags `make images` builds),
IMAGE_MAX_MB (size limit, default 40), IMAGES_OUT (where `make images` left the SBOMs, default
target/images), CONTAINERS_CONF (default images/containers.conf), REDIS_SERVER.
"""

import http.server
import json
import os
import pathlib
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

REPO = pathlib.Path(__file__).resolve().parent.parent
VERSION = next(
    line.split('"')[1]
    for line in (REPO / "Cargo.toml").read_text().splitlines()
    if line.startswith("version = ")
)
OPERATOR_IMAGE = os.environ.get("OPERATOR_IMAGE", f"localhost/sluice-operator:{VERSION}")
SIDECAR_IMAGE = os.environ.get("SIDECAR_IMAGE", f"localhost/sluice-sidecar:{VERSION}")
MAX_MB = float(os.environ.get("IMAGE_MAX_MB", "40"))
SBOM_DIR = pathlib.Path(os.environ.get("IMAGES_OUT", REPO / "target" / "images")) / "sbom"
UID = 65532
os.environ.setdefault("CONTAINERS_CONF", str(REPO / "images" / "containers.conf"))

# The chart's securityContext (runAsNonRoot with the image's UID 65532, readOnlyRootFilesystem,
# capabilities drop ALL, allowPrivilegeEscalation false) in Podman's words. `--read-only-tmpfs=false`:
# Kubernetes adds no writable /tmp or /run either. Host network: the containers reach a Redis and an
# upstream app on the host's loopback, as a pod's containers share localhost.
RUN = [
    "run",
    "--pull=never",
    "--read-only",
    "--read-only-tmpfs=false",
    "--cap-drop=all",
    "--security-opt=no-new-privileges",
    "--network=host",
]


def podman(*args, check=True, timeout=120):
    """Runs podman; returns the completed process (stdout and stderr as text)."""
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
    return proc


def wait_for(what, timeout, probe):
    """Polls `probe` until it returns something other than None, or fails naming `what`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value is not None:
                return value
        except Exception as e:  # the thing awaited is not up yet; keep the reason for the failure message
            last = e
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last})")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, headers=None):
    """GET `url`; returns (status, headers, body) for any HTTP status."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def ready_body(admin_port):
    """The sidecar's `/readyz` JSON once it answers 200, else None."""
    status, _, body = get(f"http://127.0.0.1:{admin_port}/readyz")
    return json.loads(body) if status == 200 else None


def proc_status(container):
    """The `/proc/PID/status` fields of the container's main process, read on the host."""
    pid = podman("inspect", "--format", "{{.State.Pid}}", container).stdout.strip()
    fields = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.split()
    return fields


class Container:
    """A detached container, removed on exit."""

    def __init__(self, image, *args, options=()):
        self.name = f"sluice-image-test-{os.getpid()}-{time.monotonic_ns()}"
        podman(*RUN, "-d", "--name", self.name, *options, image, *args)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        podman("rm", "-f", "-t", "0", self.name, check=False)

    def logs(self):
        p = podman("logs", self.name, check=False)
        return p.stdout + p.stderr

    def wait_exit(self, timeout):
        """Waits for the container to exit; returns its exit code."""
        return int(podman("wait", self.name, timeout=timeout).stdout.strip())


class ImageChecks:
    """Checks both images share; subclasses name the image and binary."""

    image = ""
    binary = ""

    def test_config_runs_as_65532_with_the_binary_as_entrypoint(self):
        cfg = json.loads(podman("image", "inspect", self.image).stdout)[0]["Config"]
        self.assertEqual(cfg.get("User"), f"{UID}:{UID}")
        self.assertEqual(cfg.get("Entrypoint"), [f"/usr/local/bin/{self.binary}"])

    def test_image_is_smaller_than_the_limit(self):
        size = int(podman("image", "inspect", "--format", "{{.Size}}", self.image).stdout.strip())
        print(f"\n  {self.image}: {size / 1e6:.1f} MB", file=sys.stderr, end=" ")
        self.assertLess(size / 1e6, MAX_MB, f"{self.image} is {size / 1e6:.1f} MB, over {MAX_MB} MB")

    def test_no_shell_and_no_program_but_the_binary(self):
        root = pathlib.Path(podman("image", "mount", self.image).stdout.strip())
        try:
            programs, shells = [], []
            for path in root.rglob("*"):
                rel = "/" + str(path.relative_to(root))
                if path.name in {"sh", "bash", "dash", "ash", "zsh", "busybox"}:
                    shells.append(rel)
                st = path.lstat()
                # Executable regular files other than shared objects (glibc's loader is one).
                if stat.S_ISREG(st.st_mode) and st.st_mode & 0o111 and ".so" not in path.name:
                    programs.append(rel)
            self.assertEqual(shells, [])
            self.assertEqual(programs, [f"/usr/local/bin/{self.binary}"])
        finally:
            podman("image", "unmount", self.image, check=False)
        p = podman(*RUN, "--rm", "--entrypoint", "/bin/sh", self.image, "-c", "true", check=False)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("/bin/sh", p.stderr)

    def test_sbom_describes_this_image_its_debian_packages_and_crates(self):
        bom = json.loads((SBOM_DIR / f"{self.binary}.cdx.json").read_text())
        digest = podman("image", "inspect", "--format", "{{.Digest}}", self.image).stdout.strip()
        image = bom["metadata"]["component"]
        self.assertEqual(image["type"], "container")
        self.assertEqual(image["hashes"], [{"alg": "SHA-256", "content": digest.removeprefix("sha256:")}])
        components = {(c["name"], c.get("version")) for c in bom["components"]}
        # Every package the image's dpkg status says it holds, at that version, and nothing else from Debian.
        root = pathlib.Path(podman("image", "mount", self.image).stdout.strip())
        try:
            debs = set()
            for control in (root / "var/lib/dpkg/status.d").iterdir():
                fields = dict(
                    line.split(": ", 1) for line in control.read_text().splitlines() if ": " in line and line[0] != " "
                )
                debs.add((fields["Package"], fields["Version"]))
        finally:
            podman("image", "unmount", self.image, check=False)
        listed = {(c["name"], c["version"]) for c in bom["components"] if c.get("purl", "").startswith("pkg:deb/")}
        self.assertEqual(listed, debs)
        self.assertIn("libc6", {name for name, _ in debs})
        # The binary's crates at the versions Cargo.lock pins.
        lock = (REPO / "Cargo.lock").read_text()
        for crate in ("tokio", "hyper", "rustls"):
            version = lock.split(f'name = "{crate}"\nversion = "', 1)[1].split('"', 1)[0]
            self.assertIn((crate, version), components)
        self.assertIn((self.binary, VERSION), components)

    def test_version(self):
        p = podman(*RUN, "--rm", self.image, "--version")
        self.assertEqual(p.stdout.strip(), f"{self.binary} {VERSION}")


class OperatorImage(ImageChecks, unittest.TestCase):
    image = OPERATOR_IMAGE
    binary = "sluice-operator"

    def test_help_names_the_subcommands(self):
        out = podman(*RUN, "--rm", self.image, "--help").stdout
        for sub in ("run", "crdgen", "probe"):
            self.assertIn(f"  {sub}", out)

    def test_crdgen_writes_the_checked_in_crds(self):
        with tempfile.TemporaryDirectory() as out:
            os.chown(out, UID, UID)
            podman(*RUN, "--rm", "-v", f"{out}:/out:rw", self.image, "crdgen", "--dir", "/out")
            written = sorted(p.name for p in pathlib.Path(out).iterdir())
            expected = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
            self.assertEqual(written, expected)
            for name in written:
                self.assertEqual((pathlib.Path(out) / name).read_text(), (REPO / "crds" / name).read_text(), name)

    def test_probe_runs_as_65532_without_capabilities(self):
        """`probe` (the chart's helm test hook) against a host server that answers only after the
        container's process has been looked at."""
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(30)
        port = listener.getsockname()[1]
        with listener, Container(self.image, "probe", f"http://127.0.0.1:{port}/readyz") as c:
            conn, _ = listener.accept()
            with conn:
                request = conn.recv(4096).decode()
                self.assertTrue(request.startswith("GET /readyz HTTP/1.1\r\n"), request)
                status = proc_status(c.name)
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
            self.assertEqual(c.wait_exit(30), 0, c.logs())
        self.assertEqual(status["Uid"], [str(UID)] * 4)
        self.assertEqual(status["Gid"], [str(UID)] * 4)
        self.assertEqual(status["CapEff"], ["0000000000000000"])
        self.assertEqual(status["CapBnd"], ["0000000000000000"])
        self.assertEqual(status["NoNewPrivs"], ["1"])


class Upstream(http.server.BaseHTTPRequestHandler):
    """The app behind the sidecar."""

    def do_GET(self):
        body = b"from the app\n"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class SidecarImage(ImageChecks, unittest.TestCase):
    image = SIDECAR_IMAGE
    binary = "sluice-sidecar"
    LIMIT = 3

    @classmethod
    def setUpClass(cls):
        redis = os.environ.get("REDIS_SERVER") or shutil.which("redis-server")
        if not redis:
            raise unittest.SkipTest("no redis-server (make deps installs it)")
        cls.redis_port = free_port()
        cls.redis = subprocess.Popen(
            [redis, "--port", str(cls.redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        wait_for("redis-server to answer PING", 10, lambda: cls.redis_cmd("PING") == "+PONG" or None)
        cls.app = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
        threading.Thread(target=cls.app.serve_forever, daemon=True).start()

    @classmethod
    def tearDownClass(cls):
        cls.app.shutdown()
        cls.redis.terminate()
        cls.redis.wait(10)

    @classmethod
    def redis_cmd(cls, *args):
        with socket.create_connection(("127.0.0.1", cls.redis_port), timeout=2) as s:
            s.sendall((f"*{len(args)}\r\n" + "".join(f"${len(a)}\r\n{a}\r\n" for a in args)).encode())
            return s.recv(65536).decode().split("\r\n")[0]

    def test_serves_readyz_and_limits_with_redis(self):
        listen, admin = free_port(), free_port()
        with tempfile.TemporaryDirectory() as cfg_dir:
            cfg = pathlib.Path(cfg_dir) / "config.yaml"
            cfg.write_text(
                "version: 1\n"
                "limits:\n"
                f"  listen: 127.0.0.1:{listen}\n"
                f"  adminListen: 127.0.0.1:{admin}\n"
                # Closed: a request Redis cannot decide is refused, so the 200s below are Redis's answers.
                "  failureMode: closed\n"
                "  shutdownGrace: 1s\n"
                "  rules:\n"
                "  - name: image-test\n"
                "    key: [{type: clientIp}]\n"
                "    algorithm: fixedWindow\n"
                f"    limit: {{requests: {self.LIMIT}, window: 1h}}\n"
            )
            os.chmod(cfg_dir, 0o755)
            os.chmod(cfg, 0o644)
            options = [
                "-v", f"{cfg_dir}:/etc/sluice:ro",
                "-e", f"SLUICE_UPSTREAM=http://127.0.0.1:{self.app.server_address[1]}",
                "-e", f"SLUICE_REDIS_URL=redis://127.0.0.1:{self.redis_port}",
            ]  # fmt: skip
            with Container(self.image, "--config", "/etc/sluice/config.yaml", options=options) as c:
                try:
                    ready = wait_for("the sidecar's /readyz to answer 200", 20, lambda: ready_body(admin))
                    self.assertEqual(ready["redisConfigured"], True)
                    self.assertEqual(ready["rules"], 1)
                    statuses = []
                    for _ in range(self.LIMIT + 1):
                        status, headers, body = get(f"http://127.0.0.1:{listen}/hello")
                        statuses.append(status)
                    self.assertEqual(statuses, [200] * self.LIMIT + [429])
                    self.assertEqual(headers["X-RateLimit-Limit"], str(self.LIMIT))
                    self.assertIn("Retry-After", headers)
                    self.assertNotEqual(self.redis_cmd("DBSIZE"), ":0", "the limit was not counted in Redis")
                    status = proc_status(c.name)
                    self.assertEqual(status["Uid"], [str(UID)] * 4)
                    self.assertEqual(status["CapEff"], ["0000000000000000"])
                    # SIGTERM, as the kubelet sends: the sidecar drains and exits 0.
                    podman("kill", "--signal", "TERM", c.name)
                    self.assertEqual(c.wait_exit(30), 0)
                except BaseException:
                    print(c.logs(), file=sys.stderr)
                    raise


if __name__ == "__main__":
    if os.geteuid() != 0:
        sys.exit("image-test: podman runs as root here (the images' storage is root's); run as root")
    unittest.main(verbosity=2)
