"""A local S3-compatible endpoint for tests: moto's standalone server (`moto[server]`, pinned in
requirements.txt) on 127.0.0.1 and a free port, in a subprocess of its own.

Why a real endpoint and not moto's in-process mock: pyarrow's S3FileSystem is C++ (the AWS SDK),
which moto's boto-level patching never sees; it must talk HTTP to something. The server keeps
everything in memory and is stopped (and so emptied) at the end.

Use:
    with s3_server() as s3:
        uri = s3.bucket("work")          # creates the bucket, returns "s3://work"
        s3.filesystem()                  # a configured pyarrow S3FileSystem
        s3.env                           # AWS_ENDPOINT_URL & co. for processes that read the environment

`S3Server.register(bucket)` binds `s3://<bucket>` to the configured filesystem in
sparkgnn.files (this process), so code under test sees plain `s3://bucket/key` URIs; setting
`s3.env` in the environment instead does the same for code that builds its own (pyarrow's
`FileSystem.from_uri` reads AWS_ENDPOINT_URL).

`python tests/s3_server.py` starts one, prints its endpoint and start time, and stops it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ACCESS_KEY = "sparkgnn-test"
SECRET_KEY = "sparkgnn-test-secret"
REGION = "us-east-1"


class S3ServerError(RuntimeError):
    """The server did not come up (the message carries the tail of its log)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class S3Server:
    def __init__(self, port: int, process: subprocess.Popen, log_path: str, start_seconds: float):
        self.port = port
        self.process = process
        self.log_path = log_path
        self.start_seconds = start_seconds
        self.endpoint = f"127.0.0.1:{port}"
        self.url = f"http://{self.endpoint}"
        self._registered: list[str] = []

    @property
    def env(self) -> dict[str, str]:
        """The environment that points pyarrow (and boto3) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
        }

    def filesystem(self):
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            scheme="http",
            endpoint_override=self.endpoint,
            connect_timeout=2,
            request_timeout=10,
        )

    def uri(self, bucket: str, *parts: str) -> str:
        """`s3://bucket/part/...`; with query parameters that configure pyarrow's from_uri when
        `with_options` is wanted use `options_uri`."""
        return "/".join([f"s3://{bucket}", *parts])

    def options_uri(self, bucket: str, *parts: str) -> str:
        """The same object as a URI pyarrow's FileSystem.from_uri configures itself from (the
        credentials still come from the environment: from_uri accepts no secret key)."""
        return self.uri(bucket, *parts) + f"?endpoint_override={self.endpoint}&scheme=http&region={REGION}"

    def bucket(self, name: str, register: bool = True) -> str:
        """Create bucket `name` (once) and return its `s3://name` URI, bound in sparkgnn.files to
        this server unless `register` is False."""
        import pyarrow.fs as pafs

        fs = pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            scheme="http",
            endpoint_override=self.endpoint,
            allow_bucket_creation=True,
        )
        if fs.get_file_info(name).type == pafs.FileType.NotFound:
            fs.create_dir(name)
        if register:
            self.register(name)
        return f"s3://{name}"

    def register(self, bucket: str) -> None:
        from sparkgnn import files

        files.register_filesystem(f"s3://{bucket}", self.filesystem())
        self._registered.append(f"s3://{bucket}")

    def stop(self) -> None:
        from sparkgnn import files

        for prefix in self._registered:
            files.unregister_filesystem(prefix)
        self._registered.clear()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/", timeout=1) as response:
            return response.status < 500
    except urllib.error.HTTPError as exc:  # an S3 error document still means it is up
        return exc.code < 500
    except OSError:
        return False


def start(timeout_s: float = 30.0) -> S3Server:
    started = time.perf_counter()
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="sparkgnn-moto-", suffix=".log", delete=False)  # noqa: SIM115
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if _answers(url):
            return S3Server(port, process, log.name, time.perf_counter() - started)
        time.sleep(0.1)
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=10)
    with open(log.name, errors="replace") as fh:
        tail = fh.read()[-2000:]
    raise S3ServerError(f"moto server on {url} did not answer within {timeout_s:.0f} s:\n{tail}")


@contextlib.contextmanager
def s3_server(timeout_s: float = 30.0):
    server = start(timeout_s)
    try:
        yield server
    finally:
        server.stop()
        with contextlib.suppress(OSError):
            os.remove(server.log_path)


if __name__ == "__main__":
    with s3_server() as s3:
        print(f"moto S3 endpoint {s3.url} up in {s3.start_seconds:.2f} s")
