"""walqueue-web's ASGI application: the routes, and the guard every request passes.

`create_app(source, settings)` builds a Starlette app over a `Source`.
Every request first passes `Guard` (security.py's rules: the Host header,
the password where there is one, the headers of every answer); the pages
are in pages.py. While the app runs (its lifespan) a sampler adds one sample
to the overview's history every SAMPLE_SECONDS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.convertors import Convertor, register_url_convertor
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from walqueue.errors import Unavailable

from . import pages
from .samples import SAMPLE_SECONDS
from .security import REALM, SECURITY_HEADERS, Origin, basic_user, new_secret
from .source import Source

log = logging.getLogger("walqueue.web")


@dataclass(frozen=True)
class Settings:
    origin: Origin
    allow_writes: bool = False
    passwords: dict[str, str] | None = None  # name -> password; None: loopback, no passwords
    secret: bytes = field(default_factory=new_secret)  # the CSRF tokens' key
    page_size: int = 50
    sample_seconds: float | None = SAMPLE_SECONDS  # None: no sampler (tests sample by hand)


class Guard:
    """The checks before any route, and the security headers on every answer."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self._headers = [(name.lower().encode(), value.encode()) for name, value in SECURITY_HEADERS.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), *self._headers]
            await send(message)

        if not self.settings.origin.host_allowed(headers.get("host")):
            response = PlainTextResponse("unexpected Host header: this dashboard is reached as "
                                         f"{self.settings.origin.host}:{self.settings.origin.port}\n",
                                         status_code=421)
            await response(scope, receive, send_secured)
            return
        peer = scope.get("client") or ("?", 0)
        if self.settings.passwords is not None:
            who = basic_user(headers.get("authorization"), self.settings.passwords)
            if who is None:
                response = PlainTextResponse("a name and password of the dashboard's password file "
                                             "are needed\n", status_code=401,
                                             headers={"WWW-Authenticate": f'Basic realm="{REALM}", '
                                                                          'charset="UTF-8"'})
                await response(scope, receive, send_secured)
                return
        else:
            who = f"local user at {peer[0]}"
        scope.setdefault("state", {})
        scope["state"]["who"] = who
        scope["state"]["peer"] = f"{peer[0]}:{peer[1]}"
        await self.app(scope, receive, send_secured)


class TaskIdConvertor(Convertor):
    """A task id in a path: any characters, line breaks and slashes included (Starlette's
    `path` convertor stops at a line break)."""

    regex = "[\\s\\S]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("task_id", TaskIdConvertor())


def create_app(source: Source, settings: Settings) -> Starlette:
    """The dashboard over `source`; `source` is closed when the app's lifespan ends."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        sampler = None
        if settings.sample_seconds is not None:
            sampler = asyncio.create_task(_sample_forever(source, settings.sample_seconds))
        try:
            yield
        finally:
            if sampler is not None:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
            await asyncio.get_running_loop().run_in_executor(None, source.close)

    routes = [
        Route("/", pages.overview),
        Route("/overview.json", pages.overview_json),
        Route("/plot.svg", pages.plot),
        Route("/tasks", pages.tasks),
        Route("/tasks/{task_id:task_id}", pages.task),
        Route("/task", pages.task),
        Route("/dead", pages.dead),
        Route("/dead/revive", pages.revive, methods=["POST"]),
        Route("/leases", pages.leases),
        Route("/leases/release", pages.force_release, methods=["POST"]),
        Route("/cancel", pages.cancel_form),
        Route("/cancel", pages.cancel, methods=["POST"]),
        Route("/workers", pages.workers),
        Mount("/static", StaticFiles(packages=[("walqueue.web", "static")]), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(Guard, settings=settings)],
                    exception_handlers=pages.EXCEPTION_HANDLERS, lifespan=lifespan)
    app.state.source = source
    app.state.settings = settings
    app.state.templates = pages.templates()
    return app


async def _sample_forever(source: Source, seconds: float) -> None:
    while True:
        try:
            source.history.add(await source.run(source.read_sample))
        except Unavailable as exc:
            log.warning("no sample of the queue's counts: %s", exc)
        except Exception:  # the sampler must not die of one bad answer; the pages show errors
            log.exception("no sample of the queue's counts")
        await asyncio.sleep(seconds)
