"""A Milvus Lite server of the tests' own (`python -m milvus_lite server`), stoppable."""

import socket
import subprocess
import sys
import time
from pathlib import Path

from indexer.milvus_store import import_pymilvus


class MilvusLiteServer:
    """`python -m milvus_lite server` on a fixed port, stoppable and restartable."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "milvus_lite", "server", "--data-dir", str(self.data_dir)]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        pymilvus = import_pymilvus()
        while True:
            try:
                pymilvus.MilvusClient(self.uri, timeout=1).close()
                return
            except pymilvus.MilvusException as e:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    stderr = self.process.stderr.read()
                    raise RuntimeError(f"Milvus Lite did not start: {stderr}") from e
                time.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None
