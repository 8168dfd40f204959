"""The tier runner's plan: which tier runs in front, which beside, and when each is waited for."""

from __future__ import annotations

from tests.support.tier_runner import tier_runner

ALL = ["unit", "contract", "component", "e2e", "real", "stack"]


def steps(tiers: list[str], beside: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    runner = tier_runner()
    return [
        f"{s.action} {s.tier}"
        for s in runner.plan(tiers, runner.BESIDE if beside is None else beside)
    ]


def test_make_test_runs_the_stack_beside_component_and_e2e_and_ends_it_before_real() -> None:
    """`make test`'s tiers: the stack starts with component, is waited for before real."""
    assert steps(ALL) == [
        "run unit",
        "run contract",
        "start stack",
        "run component",
        "run e2e",
        "join stack",
        "run real",
    ]


def test_a_tier_with_no_host_asked_for_runs_in_its_turn() -> None:
    """The stack alone, or with tiers it does not run beside, runs in front, in its place."""
    assert steps(["stack"]) == ["run stack"]
    assert steps(["unit", "stack", "real"]) == ["run unit", "run stack", "run real"]


def test_a_tier_asked_before_its_host_still_starts_with_it() -> None:
    """Order on the command line does not matter: the stack starts with its first host."""
    assert steps(["stack", "unit", "e2e"]) == ["run unit", "start stack", "run e2e", "join stack"]


def test_without_tiers_beside_every_tier_runs_in_turn() -> None:
    """STALLWATCH_TEST_BESIDE=0 (no tiers beside): the order asked for, one at a time."""
    assert steps(ALL, {}) == [f"run {tier}" for tier in ALL]


def test_every_tier_is_run_or_joined_exactly_once() -> None:
    """Whatever the selection, each tier asked for ends exactly once in the plan."""
    runner = tier_runner()
    for size in range(1, len(ALL) + 1):
        for start in range(len(ALL)):
            tiers = (ALL[start:] + ALL[:start])[:size]
            plan = runner.plan(tiers, runner.BESIDE)
            ended = sorted(s.tier for s in plan if s.action in ("run", "join"))
            assert ended == sorted(tiers), (tiers, plan)
            for index, step in enumerate(plan):
                if step.action == "join":
                    assert runner.Step("start", step.tier) in plan[:index], (tiers, plan)
