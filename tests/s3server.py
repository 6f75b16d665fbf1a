"""A real S3 endpoint for the tests: moto's standalone server, started as a subprocess
on 127.0.0.1 in its own process group (stopped by that group alone), spoken to over
HTTP by s3fs exactly as a remote store would be. Its request log (one line per request,
the server's own) lets tests count what a command asked for."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    endpoint: str
    log: Path
    proc: subprocess.Popen

    KEY = "bigrate-test-key"
    SECRET = "bigrate-test-secret"

    def env(self, base: dict | None = None, **kw) -> dict:
        """An environment whose standard AWS variables point at this server."""
        e = dict(os.environ if base is None else base)
        e.update(
            AWS_ACCESS_KEY_ID=self.KEY,
            AWS_SECRET_ACCESS_KEY=self.SECRET,
            AWS_ENDPOINT_URL=self.endpoint,
            AWS_DEFAULT_REGION="us-east-1",
        )
        e.update(kw)
        return e

    def fs(self):
        import s3fs

        return s3fs.S3FileSystem(
            key=self.KEY,
            secret=self.SECRET,
            client_kwargs={"endpoint_url": self.endpoint},
            skip_instance_cache=True,
            use_listings_cache=False,
        )

    def requests(self) -> list[str]:
        """The request lines the server has logged so far (``"GET /b/k HTTP/1.1"``)."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if '"' in line and " HTTP/1.1" in line:
                req = line.split('"')[1]
                out.append(req.replace("\x1b[35m\x1b[1m", "").replace("\x1b[0m", ""))
        return out

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        except ProcessLookupError:
            pass


def start_s3_server(log: Path, timeout: float = 60.0) -> S3Server:
    port = _free_port()
    f = open(log, "w")  # noqa: SIM115 - the server writes it for its whole life
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=f,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    f.close()
    t0 = time.time()
    while True:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if proc.poll() is not None or time.time() - t0 > timeout:
            proc.kill()
            raise RuntimeError(f"moto server did not start: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    return S3Server(f"http://127.0.0.1:{port}", log, proc)
