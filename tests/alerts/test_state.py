"""RuleState on its own, on hand-made vectors: labels and annotations rendered per result,
pending -> firing after `for:`, resolved when the result goes, resolved alerts kept 15 minutes
(Prometheus' retention, so notifications of them repeat), transitions stamped with their time."""

from __future__ import annotations

import pytest

from alerts.errors import AlertRuleError
from alerts.fingerprint import fingerprint
from alerts.promql.types import Sample, make_labels
from alerts.rules import parse_rules
from alerts.state import FIRING, PENDING, RESOLVED, RESOLVED_RETENTION_S, RuleState

T0 = 1_700_000_000.0  # epoch seconds, as the evaluator passes them


def rule_state(for_s: str = "1m", *, value_label: bool = False) -> RuleState:
    labels = {
        "severity": "warning",
        "where": "{{ $labels.device }}",
        "gone": "",  # an empty label is dropped
    }
    if value_label:  # a label with the value makes every new value a new alert (as Prometheus)
        labels["level"] = "{{ $value }}"
    document = {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {
                        "alert": "Hot",
                        "expr": "temperature > 1",
                        "for": for_s,
                        "labels": labels,
                        "annotations": {"summary": "{{ $labels.device }} at {{ $value }}"},
                    }
                ],
            }
        ]
    }
    return RuleState(parse_rules(document)[0].rules[0])


def sample(device: str, value: float) -> Sample:
    return Sample(make_labels({"__name__": "temperature", "device": device}), value)


def test_labels_and_annotations_are_rendered_from_the_result() -> None:
    state = rule_state(value_label=True)
    (tr,) = state.evaluate([sample("cpu", 2.5)], T0)
    assert (tr.state, tr.ts) == (PENDING, T0)
    labels = {"alertname": "Hot", "device": "cpu", "severity": "warning", "where": "cpu"}
    assert tr.alert.labels == {**labels, "level": "2.5"}  # no __name__, no empty "gone"
    assert tr.alert.annotations == {"summary": "cpu at 2.5"}
    assert tr.alert.value == 2.5 and tr.alert.active_at == T0
    assert tr.alert.fingerprint == fingerprint(tr.alert.labels) != ""


def test_several_results_with_one_label_set_are_an_error() -> None:
    state = rule_state()
    with pytest.raises(AlertRuleError) as exc:
        state.evaluate([sample("cpu", 2.0), sample("cpu", 3.0)], T0)
    assert "Hot: several results share the label set" in exc.value.message


def test_every_result_is_followed_pending_to_firing_to_resolved() -> None:
    state = rule_state("1m")
    (a, b) = (sample("a", 2.0), sample("b", 3.0))
    assert [t.state for t in state.evaluate([a, b], T0)] == [PENDING, PENDING]
    # both still there: no transition, both values updated (a second result is not skipped)
    assert state.evaluate([sample("a", 2.2), sample("b", 3.3)], T0 + 30) == []
    assert sorted(x.value for x in state.active()) == [2.2, 3.3]
    fired = state.evaluate([a, b], T0 + 60)
    assert [(t.state, t.ts, t.alert.labels["device"]) for t in fired] == [
        (FIRING, T0 + 60, "a"),
        (FIRING, T0 + 60, "b"),
    ]
    # b goes while a stays: b resolves (a result seen first does not stop the check of the rest)
    resolved = state.evaluate([a], T0 + 90)
    assert [(t.state, t.ts, t.alert.labels["device"]) for t in resolved] == [
        (RESOLVED, T0 + 90, "b")
    ]
    assert [x.labels["device"] for x in state.active()] == ["a"]
    assert [x.labels["device"] for x in state.active((RESOLVED,))] == ["b"]


def test_a_pending_alert_that_goes_is_dropped_without_a_transition() -> None:
    state = rule_state("1m")
    state.evaluate([sample("a", 2.0), sample("b", 2.0)], T0)
    assert state.evaluate([sample("b", 2.0)], T0 + 30) == []
    assert [x.labels["device"] for x in state.alerts.values()] == ["b"]


def test_resolved_alerts_are_kept_for_the_retention_then_dropped() -> None:
    state = rule_state("0s")
    assert [t.state for t in state.evaluate([sample("a", 2.0)], T0)] == [PENDING, FIRING]
    state.evaluate([], T0 + 10)
    assert [x.state for x in state.alerts.values()] == [RESOLVED]
    state.evaluate([], T0 + 10 + RESOLVED_RETENTION_S)  # exactly the retention: still kept
    assert [x.resolved_at for x in state.alerts.values()] == [T0 + 10]
    state.evaluate([], T0 + 10 + RESOLVED_RETENTION_S + 1)
    assert state.alerts == {}


def test_a_result_that_comes_back_after_resolving_starts_pending_again() -> None:
    state = rule_state("0s")
    state.evaluate([sample("a", 2.0)], T0)
    state.evaluate([], T0 + 10)
    again = state.evaluate([sample("a", 4.0)], T0 + 20)
    assert [(t.state, t.ts, t.alert.value) for t in again] == [
        (PENDING, T0 + 20, 4.0),
        (FIRING, T0 + 20, 4.0),
    ]
