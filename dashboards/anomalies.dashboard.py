"""Anomalies: verified results whose production output drifts from the fp32 reference path.

Prometheus counts anomalies at the runtime's own threshold; the SQL panels re-run the audit
(`ABS(output - expected) > threshold`) over `inference_log` with the threshold as a dashboard
variable, so an operator can tighten or loosen it without redeploying.
"""

from grafanalib.core import Stat, Table, TimeSeries

from dashboards.common import (
    JAEGER,
    MODEL_SEL,
    POSTGRES,
    PROMETHEUS,
    RATE,
    make_dashboard,
    or_zero,
    prom,
    sql,
    variables,
)

ANOMALIES = f"fastllm_operator_anomalies_total{{{MODEL_SEL}}}"
# Rows of the selected models within the dashboard's time range that carry a verification.
VERIFIED_ROWS = """
FROM inference_log
WHERE $__timeFilter(ts)
  AND op IS NOT NULL
  AND model ~ '^${model:regex}$'
  AND version ~ '^${version:regex}$'"""

ANOMALIES_PER_OP_SQL = f"""
SELECT $__timeGroupAlias(ts, $__interval), op AS metric, COUNT(*) AS anomalies
{VERIFIED_ROWS}
  AND ABS(output - expected) > $threshold
GROUP BY 1, 2
ORDER BY 1, 2"""

PER_OP_SUMMARY_SQL = f"""
SELECT op,
       COUNT(*) AS verified,
       SUM(CASE WHEN ABS(output - expected) > $threshold THEN 1 ELSE 0 END) AS anomalies,
       MAX(ABS(output - expected)) AS max_abs_error
{VERIFIED_ROWS}
GROUP BY op
ORDER BY anomalies DESC, op"""

LATEST_ROWS_SQL = f"""
SELECT ts AS "time", request_id, model, version, status, op, output, expected,
       ABS(output - expected) AS abs_error
{VERIFIED_ROWS}
  AND ABS(output - expected) > $threshold
ORDER BY ts DESC
LIMIT 50"""

# request_id cells open the request's trace (the tracing sink sets fastllm.request_id on spans).
TRACE_LINK = {
    "matcher": {"id": "byName", "options": "request_id"},
    "properties": [
        {
            "id": "links",
            "value": [
                {
                    "title": "Trace in Jaeger",
                    "url": "",
                    "internal": {
                        "datasourceUid": JAEGER["uid"],
                        "datasourceName": "Jaeger",
                        "query": {
                            "queryType": "search",
                            "service": "fastllm",
                            "tags": 'fastllm.request_id="${__value.raw}"',
                        },
                    },
                }
            ],
        }
    ],
}

dashboard = make_dashboard(
    uid="fastllm-anomalies",
    title="fastllm / Operator anomalies",
    description="fastllm_operator_anomalies_total by op, and the inference_log audit with an "
    "adjustable threshold.",
    templates=variables(threshold=True),
    time_from="now-24h",
    rows=[
        (
            8,
            [
                (
                    6,
                    Stat(
                        color={"mode": "thresholds"},
                        title="Anomalies in range (Prometheus)",
                        description="Verified results beyond the runtime's threshold.",
                        dataSource=PROMETHEUS,
                        targets=[
                            prom(or_zero(f"sum(increase({ANOMALIES}[$__range]))"), instant=True)
                        ],
                        reduceCalc="lastNotNull",
                        noValue="0",
                        thresholds=[
                            {"color": "green", "value": None},
                            {"color": "red", "value": 1},
                        ],
                        colorMode="background",
                    ),
                ),
                (
                    18,
                    TimeSeries(
                        title="Anomalies by op (Prometheus)",
                        description="Any anomaly fires FastllmOperatorAnomalies. One op alone "
                        "points at that kernel (e.g. geglu after a weight conversion); all ops "
                        "at once points at the dtype or the device.",
                        dataSource=PROMETHEUS,
                        targets=[
                            prom(f"sum by (op) (increase({ANOMALIES}[{RATE}]))", "{{op}}"),
                        ],
                        unit="short",
                        drawStyle="bars",
                        fillOpacity=60,
                        stacking={"mode": "normal", "group": "A"},
                    ),
                ),
            ],
        ),
        (
            8,
            [
                (
                    14,
                    TimeSeries(
                        title="Anomalies per op over time (inference_log, threshold $threshold)",
                        description="The audit query per op and time bucket: rows with "
                        "ABS(output - expected) above the dashboard's threshold.",
                        dataSource=POSTGRES,
                        targets=[sql(ANOMALIES_PER_OP_SQL)],
                        unit="short",
                        drawStyle="bars",
                        fillOpacity=60,
                        stacking={"mode": "normal", "group": "A"},
                    ),
                ),
                (
                    10,
                    Table(
                        title="Verified rows per op (inference_log)",
                        description="How many results each probe verified, how many exceed the "
                        "threshold, and the worst absolute error seen.",
                        dataSource=POSTGRES,
                        targets=[sql(PER_OP_SUMMARY_SQL, table=True)],
                    ),
                ),
            ],
        ),
        (
            10,
            [
                (
                    24,
                    Table(
                        title="Latest anomalous rows (inference_log)",
                        description="Newest first. request_id joins the request's trace in "
                        "Jaeger (span attribute fastllm.request_id) and its server log lines.",
                        dataSource=POSTGRES,
                        targets=[sql(LATEST_ROWS_SQL, table=True)],
                        overrides=[TRACE_LINK],
                    ),
                ),
            ],
        ),
    ],
)
