"""runtime.serving.router: stable / canary split, sticky per user, unknown models."""

from __future__ import annotations

import random

import pytest

from runtime.errors import ConfigError, ModelNotFoundError
from runtime.serving.router import Router, user_fraction


def test_unknown_model_is_not_found() -> None:
    router = Router()
    router.add("m", stable="engine-a")
    with pytest.raises(ModelNotFoundError) as info:
        router.pick("other")
    assert info.value.param == "model" and info.value.http_status == 404
    with pytest.raises(ConfigError):
        router.add("m", stable="engine-b")


def test_canary_weight_splits_anonymous_traffic() -> None:
    router = Router(rng=random.Random(7))
    router.add("m", stable="a", canary="b", canary_weight=0.25)
    versions = [router.pick("m").version for _ in range(4000)]
    share = versions.count("canary") / len(versions)
    assert 0.2 < share < 0.3  # binomial(4000, 0.25): 0.2 and 0.3 are > 7 sigma away


def test_users_are_sticky_and_split_by_weight() -> None:
    router = Router()
    router.add("m", stable="a", canary="b", canary_weight=0.5)
    users = [f"user-{i}" for i in range(2000)]
    first = {u: router.pick("m", user=u).version for u in users}
    assert all(router.pick("m", user=u).version == first[u] for u in users)
    share = sum(v == "canary" for v in first.values()) / len(users)
    assert 0.42 < share < 0.58
    assert all((user_fraction(u) < 0.5) == (first[u] == "canary") for u in users)


def test_no_canary_means_stable() -> None:
    router = Router()
    router.add("m", stable="a", canary_weight=0.9)  # a weight without a canary is ignored
    assert {router.pick("m", user=str(i)).engine for i in range(50)} == {"a"}
