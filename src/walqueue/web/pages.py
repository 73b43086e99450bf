"""The dashboard's pages: one function per route, each reading the queue through the app's
`Source` (on its thread pool) and rendering a template of templates/.

Reads are GETs and change nothing. Writes (revive, force-release, cancel)
are POSTs only, and each is checked in this order before anything is done:
`--allow-writes` (403 otherwise), the CSRF token of the form (403), the
Origin header (403); then it runs, and is logged at INFO with who asked,
from where, what, and what came of it.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.templating import Jinja2Templates

from walqueue import InvalidRequest, display
from walqueue.errors import Unavailable

from . import formatting
from .forms import FormError, read_form
from .plot import svg
from .security import CSRF_FIELD, csrf_token, csrf_valid
from .source import MAX_PAGE_SIZE, STATUSES, Outcome, PagingUnsupported, Source

log = logging.getLogger("walqueue.web")
SVG_TYPE = "image/svg+xml"
NOT_COUNTED = "\u2013"  # a figure the backend does not count (the page says so)


def templates() -> Jinja2Templates:
    environment = jinja2.Environment(loader=jinja2.PackageLoader("walqueue.web", "templates"),
                                     autoescape=True, undefined=jinja2.StrictUndefined)
    environment.filters.update(formatting.FILTERS)
    environment.globals["relative"] = formatting.relative
    return Jinja2Templates(env=environment)


def _source(request: Request) -> Source:
    return request.app.state.source


def _render(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
    settings = request.app.state.settings
    source = _source(request)
    context.update(
        allow_writes=settings.allow_writes,
        csrf_field=CSRF_FIELD,
        csrf=csrf_token(settings.secret, request.state.who),
        who=request.state.who,
        daemon=source.has_daemon_stats,
        can_force_release=source.can_force_release,
        now=source.clock(),
    )
    return request.app.state.templates.TemplateResponse(request, template, context, status_code=status_code)


def _error(request: Request, status_code: int, message: str) -> Response:
    return _render(request, "error.html", status_code, message=message)


# -- overview -----------------------------------------------------------------------------


def figures(source: Source) -> dict[str, str]:
    """The overview's live figures as the page prints them (overview.json, and the page itself)."""
    overview = source.overview()
    stats, daemon = overview.stats, overview.daemon
    delayed = getattr(stats, "delayed", None)
    shown: dict[str, str] = {
        "ready": formatting.number(stats.ready),
        "delayed": formatting.number(delayed) if delayed is not None else NOT_COUNTED,
        "leased": formatting.number(stats.leased),
        "completed": formatting.number(stats.completed),
        "dead": formatting.number(stats.dead),
        "sampled": formatting.local_time(overview.at),
    }
    if daemon is not None:
        shown.update({
            "oldest_ready": formatting.duration(daemon.oldest_ready_age_seconds),
            "fsync_p99": formatting.milliseconds(daemon.fsync_p99_seconds),
            "requests_per_fsync": formatting.number(daemon.requests_per_fsync),
            "slow_turns": formatting.number(getattr(daemon, "slow_turns_total", None)),
            "connections": formatting.number(daemon.connections),
            "compactions": formatting.number(daemon.compactions_total),
            "paused": "paused: reserves get nothing" if daemon.paused else "serving",
        })
    return shown


async def overview(request: Request) -> Response:
    source = _source(request)
    shown = await source.run(figures, source)
    return _render(request, "overview.html", figures=shown, not_counted=NOT_COUNTED,
                   compactions=list(reversed(source.history.compactions)))


async def overview_json(request: Request) -> Response:
    source = _source(request)
    return JSONResponse(await source.run(figures, source))


async def plot(request: Request) -> Response:
    source = _source(request)
    return Response(svg(source.history.rates(), source.clock()), media_type=SVG_TYPE)


# -- listings -----------------------------------------------------------------------------


def _listing_arguments(request: Request, status: str | None) -> tuple[str | None, str, str | None, int]:
    query = request.query_params
    if status is None:
        status = query.get("status") or None
    if status is not None and status not in STATUSES:
        raise HTTPException(400, f"status must be one of {', '.join(STATUSES)}")
    prefix = query.get("prefix", "")
    after = query.get("after") or None
    size_text = query.get("size", str(request.app.state.settings.page_size))
    if not size_text.isdigit() or not 1 <= int(size_text) <= MAX_PAGE_SIZE:
        raise HTTPException(400, f"size must be a number from 1 to {MAX_PAGE_SIZE}")
    return status, prefix, after, int(size_text)


async def _listing(request: Request, template: str, status: str | None, base: str) -> Response:
    status, prefix, after, size = _listing_arguments(request, status)
    source = _source(request)
    page = await source.run(source.page, status, prefix, after, size)
    next_url = None
    if page.next_after is not None:
        fields = {"status": status or "", "prefix": prefix, "after": page.next_after}
        if size != request.app.state.settings.page_size:
            fields["size"] = str(size)
        next_url = f"{base}?" + urlencode({k: v for k, v in fields.items() if v},
                                          quote_via=lambda s, *_: formatting.url_part(s))
    return _render(request, template, page=page, status=status, prefix=prefix, after=after,
                   statuses=STATUSES, next_url=next_url, first=after is None)


async def tasks(request: Request) -> Response:
    return await _listing(request, "tasks.html", None, "/tasks")


async def dead(request: Request) -> Response:
    return await _listing(request, "dead.html", "dead", "/dead")


async def leases(request: Request) -> Response:
    return await _listing(request, "leases.html", "leased", "/leases")


async def task(request: Request) -> Response:
    """/tasks/ID, or /task?id=ID (formatting.task_url)."""
    task_id = request.path_params.get("task_id") or request.query_params.get("id")
    if not task_id:
        return _error(request, 400, "which task? /tasks/ID or /task?id=ID")
    source = _source(request)
    view = await source.run(source.task, task_id)
    if view is None:
        return _error(request, 404, f"no task {display.name(task_id)} in this queue")
    return _render(request, "task.html", task=view)


async def workers(request: Request) -> Response:
    source = _source(request)
    return _render(request, "workers.html", workers=await source.run(source.workers),
                   connections=await source.run(source.connections))


async def cancel_form(request: Request) -> Response:
    return _render(request, "cancel.html", ids=request.query_params.getlist("task_id"))


# -- writes -------------------------------------------------------------------------------


async def _write(request: Request, action: str, run) -> Response:
    settings = request.app.state.settings
    who, peer = request.state.who, request.state.peer
    if not settings.allow_writes:
        log.warning("refused %s from %s (%s): walqueue-web runs without --allow-writes", action, who, peer)
        return _error(request, 403, "this dashboard is read-only: start walqueue-web with "
                                    "--allow-writes to revive, release or cancel")
    try:
        form = await read_form(request)
    except FormError as exc:
        return _error(request, exc.status, str(exc))
    token = (form.get(CSRF_FIELD) or [None])[-1]
    if not csrf_valid(settings.secret, who, token):
        log.warning("refused %s from %s (%s): no valid CSRF token", action, who, peer)
        return _error(request, 403, "the form has no valid CSRF token (a page of a previous "
                                    "walqueue-web, or a form from another site): reload the page")
    if not settings.origin.origin_allowed(request.headers.get("origin"), request.headers.get("host")):
        log.warning("refused %s from %s (%s): Origin %s", action, who, peer,
                    display.text(request.headers.get("origin", "")))
        return _error(request, 403, "the form was sent from another site")
    one = form.get("one", [])
    try:
        task_ids = [formatting.from_url_part(value) for value in (one[-1:] if one else form.get("task_id", []))]
    except UnicodeDecodeError:
        return _error(request, 400, "a task id in the form is not UTF-8")
    task_ids += [line.strip() for text in form.get("task_ids", []) for line in text.splitlines()
                 if line.strip()]
    if not task_ids:
        return _error(request, 400, "no task selected")
    source = _source(request)
    outcome: Outcome = await source.run(run, source, task_ids)
    log.info("%s by %s (%s): asked %s; done %s; refused %s", action, who, peer,
             display.json_line(task_ids), display.json_line(outcome.changed),
             display.json_line(outcome.refused))
    return _render(request, "done.html", 200 if outcome.changed or not outcome.refused else 409,
                   action=action, outcome=outcome)


async def revive(request: Request) -> Response:
    return await _write(request, "revive", Source.revive)


async def force_release(request: Request) -> Response:
    if not _source(request).can_force_release:
        return _error(request, 405, "this backend has no force-release")
    return await _write(request, "force-release", Source.force_release)


async def cancel(request: Request) -> Response:
    return await _write(request, "cancel", Source.cancel)


# -- errors -------------------------------------------------------------------------------


async def _http_error(request: Request, exc: HTTPException) -> Response:
    if getattr(request.state, "who", None) is None:  # refused before the guard named anyone
        return Response(exc.detail, status_code=exc.status_code, media_type="text/plain")
    return _error(request, exc.status_code, exc.detail)


async def _unavailable(request: Request, exc: Exception) -> Response:
    return _error(request, 503, f"the queue cannot be reached: {display.text(str(exc))}")


async def _invalid(request: Request, exc: Exception) -> Response:
    return _error(request, 400, display.text(str(exc)))


async def _paging(request: Request, exc: Exception) -> Response:
    return _error(request, 501, str(exc))


EXCEPTION_HANDLERS = {HTTPException: _http_error, Unavailable: _unavailable,
                      InvalidRequest: _invalid, PagingUnsupported: _paging}
