"""Model name -> version: which engine serves a request.

Each served model has a `stable` version and optionally a canary that takes a fraction (`weight`)
of the traffic. A request that names a `user` always lands on the same version (the user's id is
hashed into [0, 1) and compared with the weight), so one person does not flip between versions
mid-conversation; anonymous requests are split at random.

    router = Router()
    router.add("llama-tiny", stable=engine_a, canary=engine_b, canary_weight=0.1)
    route = router.pick("llama-tiny", user="alice")    # Route(model, version, engine)
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from runtime.errors import ConfigError, ConflictError, ModelNotFoundError

if TYPE_CHECKING:
    from runtime.engine.client import EngineClient


@dataclass(frozen=True)
class Version:
    name: str  # the `version` label ("stable", "canary", ...)
    engine: EngineClient  # the router only hands it out; it never calls it


@dataclass
class ModelRoute:
    model: str  # the name clients send as `model`
    stable: Version
    canary: Version | None = None
    canary_weight: float = 0.0  # fraction of requests (or users) sent to the canary

    @property
    def versions(self) -> list[Version]:
        return [self.stable] + ([self.canary] if self.canary is not None else [])


@dataclass(frozen=True)
class Route:
    model: str
    version: str
    engine: EngineClient
    adapter: str = ""  # a LoRA adapter's name (`model` then names it too); "": the base model
    parent: str = ""  # with an adapter: the base model it was loaded on

    @property
    def base_model(self) -> str:
        """The served model this request runs on (an adapter's parent)."""
        return self.parent or self.model


def user_fraction(user: str) -> float:
    """A stable point in [0, 1) for `user` (the same in every process, unlike hash())."""
    digest = hashlib.sha256(user.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass
class Router:
    routes: dict[str, ModelRoute] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)
    adapters: dict[str, str] = field(default_factory=dict)  # LoRA adapter -> its parent model

    def add_adapter(self, name: str, parent: str) -> None:
        """`name` selects adapter `name` on `parent`'s engines (registered there first)."""
        self.route_of(parent)
        if name in self.routes or name in self.adapters:
            raise ConflictError(f"model name {name!r} is already served", param="lora_name")
        self.adapters[name] = parent

    def remove_adapter(self, name: str) -> str:
        """Forget the adapter's name; returns its parent."""
        parent = self.adapters.pop(name, None)
        if parent is None:
            raise ModelNotFoundError(
                f"adapter {name!r} is not loaded", param="lora_name", code="model_not_found"
            )
        return parent

    def add(
        self,
        model: str,
        *,
        stable: EngineClient,
        stable_version: str = "stable",
        canary: EngineClient | None = None,
        canary_version: str = "canary",
        canary_weight: float = 0.0,
    ) -> ModelRoute:
        if model in self.routes:
            raise ConfigError(f"model {model!r} is already routed", param="model")
        if not 0.0 <= canary_weight <= 1.0:
            raise ConfigError("canary_weight must be in [0, 1]", param="canary_weight")
        route = ModelRoute(
            model,
            Version(stable_version, stable),
            Version(canary_version, canary) if canary is not None else None,
            canary_weight if canary is not None else 0.0,
        )
        self.routes[model] = route
        return route

    def route_of(self, model: str) -> ModelRoute:
        route = self.routes.get(model)
        if route is None:
            known = ", ".join(sorted(self.routes)) or "none"
            raise ModelNotFoundError(
                f"model {model!r} does not exist (served: {known})",
                param="model",
                code="model_not_found",
            )
        return route

    # Rollout changes replace the ModelRoute as a whole (one dict store), so a concurrent `pick`
    # sees either the old route or the new one, never a half-updated mix.
    def set_canary_weight(self, model: str, weight: float) -> ModelRoute:
        route = self.route_of(model)
        if route.canary is None:
            raise ConfigError(f"model {model!r} has no canary version", param="model")
        if not 0.0 <= weight <= 1.0:
            raise ConfigError("weight must be in [0, 1]", param="weight")
        self.routes[model] = replace(route, canary_weight=weight)
        return self.routes[model]

    def promote(self, model: str) -> Version:
        """The canary becomes the stable version (all traffic); returns the retired version, whose
        engine still finishes the requests it holds."""
        route = self.route_of(model)
        if route.canary is None:
            raise ConfigError(f"model {model!r} has no canary version to promote", param="model")
        self.routes[model] = replace(route, stable=route.canary, canary=None, canary_weight=0.0)
        return route.stable

    def pick(self, model: str, *, user: str | None = None) -> Route:
        parent = self.adapters.get(model)
        if parent is not None and model not in self.routes:  # a LoRA adapter on its parent
            base = self.pick(parent, user=user)
            return replace(base, model=model, adapter=model, parent=base.model)
        route = self.route_of(model)
        version = route.stable
        if route.canary is not None and route.canary_weight > 0.0:
            point = user_fraction(user) if user else self.rng.random()
            if point < route.canary_weight:
                version = route.canary
        return Route(route.model, version.name, version.engine)

    @property
    def model_names(self) -> list[str]:
        return sorted(self.routes)

    def engines(self) -> Iterator[tuple[str, str, EngineClient]]:
        """(model, version, engine) for every served version."""
        for route in self.routes.values():
            for version in route.versions:
                yield route.model, version.name, version.engine
