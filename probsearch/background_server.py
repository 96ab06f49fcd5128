"""A uvicorn server for create_app(settings) run in a thread of this process (demo, tests)."""

import threading
import time

import uvicorn

from models.settings import Settings
from service.http.main import create_app
from service.http.transport import server_options


class BackgroundServer:
    """Context manager: starts the app on settings.host:settings.port (0: a free port)."""

    def __init__(self, settings: Settings, log_level: str = "warning") -> None:
        self.app = create_app(settings)
        config = uvicorn.Config(
            self.app,
            host=settings.host,
            port=settings.port,
            log_level=log_level,
            **server_options(settings),
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = ""

    def __enter__(self) -> "BackgroundServer":
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start (see the log above)")
            time.sleep(0.05)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    def wait(self) -> None:
        """Block until the server stops (Ctrl-C stops it)."""
        while self.thread.is_alive():
            self.thread.join(timeout=0.5)

    def __exit__(self, *exc_info: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    @property
    def services(self):
        """The app's long-lived services (to look inside the running server)."""
        return self.app.state.services
