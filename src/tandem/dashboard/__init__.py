"""``tandem dashboard``: a read-only status page over the observation ``tandem status`` makes.

Modules, one job each: ``observe`` (one status a refresh, and what follows from the last
few: traffic, last token, last canary), ``traffic`` (rates and p95s between two readings of a
leader's /metrics), ``html`` (escaping and tiles that name their source), ``sections`` (the
page's parts), ``page`` (the document, its styles and refresh script), ``server`` (the ASGI
app, its access rule, uvicorn; starlette and uvicorn imported only there).
"""
