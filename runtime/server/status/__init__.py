"""The status page at `/` (docs/status-page.md): one page over the server's own metrics, alerts
and audit, with no build step and no external service.

routes.py        GET /, its static files, /status/api/* and the Prometheus-shaped /api/v1/query*
auth.py          who may read the page's data (API key or admin token) and who sees owner details
page.py          StatusPage: the catalogue, query service and window, built once per app
catalog.py       the panels of the generated dashboards, with their PromQL, in the page's window
query.py         the query service over the embedded evaluator's store (instant / range)
query_runner.py  where queries run: their own threads, a deadline, bounded samples and bytes
facts.py         alert states and the operator-anomaly audit beside the series
summary.py       what is served, memory totals and (for the admin) who holds the memory
static/          the page's HTML, scripts and stylesheet (package data)
"""
