"""A live server shared by a test module: the tiny random llama ("llama") and bert ("bert")."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.runtime.server.live import LiveServer, engine_for, light_settings, live_server, router_of


@pytest.fixture(scope="module")
def served(demo_model_dir: Callable[[str], Path]) -> Iterator[LiveServer]:
    llama, bert = demo_model_dir("llama"), demo_model_dir("bert")
    make_router = router_of(
        llama=partial(engine_for, llama, name="llama"),
        bert=partial(engine_for, bert, name="bert"),
    )
    with live_server(light_settings(), make_router) as server:
        yield server
