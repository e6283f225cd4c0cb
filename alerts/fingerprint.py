"""Alert fingerprints computed as Alertmanager computes them (prometheus/common model
LabelSet.Fingerprint: FNV-1a 64 over sorted name/value pairs, each followed by 0xff), so the
ids in our payloads and in `alert_events` equal the ones Alertmanager shows."""

from __future__ import annotations

from collections.abc import Mapping

_OFFSET64 = 14695981039346656037
_PRIME64 = 1099511628211
_MASK = (1 << 64) - 1
_SEPARATOR = 0xFF


def fingerprint(labels: Mapping[str, str]) -> str:
    h = _OFFSET64
    for name in sorted(labels):
        for chunk in (name, labels[name]):
            for byte in chunk.encode():
                h = ((h ^ byte) * _PRIME64) & _MASK
            h = ((h ^ _SEPARATOR) * _PRIME64) & _MASK
    return f"{h:016x}"
