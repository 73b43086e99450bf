"""walqueue-web: a dashboard of one queue, for a walqueued socket or a PostgreSQL DSN alike
(SPEC §8b, docs/web.md). Needs the extra walqueue[web] (Starlette, uvicorn, Jinja2).

Server-rendered HTML, no JavaScript build step: one script of ours
(static/live.js) refreshes the overview's figures in place.

| module | concept |
|---|---|
| cli.py | the command line: options, the client, uvicorn |
| app.py | the ASGI app: routes, the guard every request passes, the sampler |
| pages.py | one function per page; templates/ holds their HTML |
| source.py | the backend client behind a small thread pool; paged listings |
| samples.py | the overview's hour of samples and the rates from them (pure) |
| plot.py | the rates as an SVG plot (pure) |
| security.py | loopback or TLS + passwords, CSRF tokens, the headers (pure) |
| bounds.py | connection bounds, as walqueued's metrics endpoint's |
| forms.py | the writes' form bodies, read within bounds |
| formatting.py | names, payloads, times as the pages write them (pure) |
"""
