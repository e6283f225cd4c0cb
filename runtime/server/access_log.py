"""Keep the status page's own polling out of uvicorn's access log.

One open status page asks `/status/api/summary` and every panel's PromQL (`/api/v1/query`,
`/api/v1/query_range`) each refresh: ~130 access-log lines every 10 s (issue 39), burying the
API's own lines. These reads are the page's, not clients' work, so their successful answers are
not logged; an error answer (status >= 400) still is, as is the page itself (`/`).

uvicorn logs each request as `'%s - "%s %s HTTP/%s" %d'` with args (client, method, path with
query string, HTTP version, status) on the `uvicorn.access` logger (its h11 and httptools
protocols alike); the filter reads those args and lets anything of another shape through.
"""

from __future__ import annotations

import logging

__all__ = ["QUIET_PREFIXES", "StatusPageFilter", "install"]

# the status page's read-only API and its static files (runtime.server.status.routes)
QUIET_PREFIXES = ("/status/api/", "/status/static/", "/api/v1/query")
ACCESS_LOGGER = "uvicorn.access"


class StatusPageFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        path, status = args[2], args[4]
        if not isinstance(path, str) or not isinstance(status, int) or status >= 400:
            return True
        return not path.startswith(QUIET_PREFIXES)


def install(logger: logging.Logger | None = None) -> StatusPageFilter:
    """Add the filter to uvicorn's access logger once (after uvicorn configured its logging)."""
    logger = logger or logging.getLogger(ACCESS_LOGGER)
    for existing in logger.filters:
        if isinstance(existing, StatusPageFilter):
            return existing
    quiet = StatusPageFilter()
    logger.addFilter(quiet)
    return quiet
