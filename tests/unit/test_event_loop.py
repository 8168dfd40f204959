"""Which event loop the exporter runs on: uvloop where installed, asyncio's own on request."""

from __future__ import annotations

import asyncio
import types

import pytest

from stallwatch.common.event_loop import (
    EventLoopUnavailable,
    choose_event_loop,
    run_on,
)


def fake_uvloop(version: str = "9.9.9") -> types.ModuleType:
    module = types.ModuleType("uvloop")
    module.__version__ = version  # type: ignore[attr-defined]
    module.new_event_loop = asyncio.new_event_loop  # type: ignore[attr-defined]
    return module


def test_auto_takes_uvloop_when_it_is_installed() -> None:
    """`auto` with uvloop importable is uvloop, named with its version."""
    chosen = choose_event_loop("auto", find=lambda _: fake_uvloop("1.2.3"))
    assert chosen.describe() == "uvloop 1.2.3"


def test_auto_falls_back_to_asyncio_without_uvloop() -> None:
    """`auto` with no uvloop is asyncio's own loop, not an error."""
    chosen = choose_event_loop("auto", find=lambda _: None)
    assert chosen.name == "asyncio"
    assert chosen.new_loop is asyncio.new_event_loop


def test_asyncio_asked_for_never_looks_for_uvloop() -> None:
    """`asyncio` is asyncio's loop even where uvloop is installed."""

    def find(name: str) -> types.ModuleType:
        raise AssertionError(f"looked for {name}")

    assert choose_event_loop("asyncio", find=find).name == "asyncio"


def test_uvloop_asked_for_and_missing_is_an_error_saying_how_to_install_it() -> None:
    """`uvloop` where it is not installed fails with what to do, instead of falling back."""
    with pytest.raises(EventLoopUnavailable, match=r"pip install uvloop"):
        choose_event_loop("uvloop", find=lambda _: None)


def test_an_unknown_loop_is_an_error_naming_the_choices() -> None:
    """A name that is no loop is refused with the three it may be."""
    with pytest.raises(EventLoopUnavailable, match=r"'auto', 'uvloop', 'asyncio'"):
        choose_event_loop("trio")


def test_run_on_runs_the_coroutine_on_a_loop_of_the_chosen_kind() -> None:
    """The coroutine runs on a loop made by the choice's factory, and its result comes back."""
    made: list[asyncio.AbstractEventLoop] = []

    def new_loop() -> asyncio.AbstractEventLoop:
        made.append(asyncio.new_event_loop())
        return made[-1]

    module = fake_uvloop()
    module.new_event_loop = new_loop  # type: ignore[attr-defined]
    chosen = choose_event_loop("uvloop", find=lambda _: module)

    async def which_loop() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    assert run_on(chosen, which_loop()) is made[0]
