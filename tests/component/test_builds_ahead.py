"""The real tier's missing environments are built in the background and waited for."""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.tier_runner import tier_runner

FAKE_SETUP = """
import pathlib, sys, time

BUILT = pathlib.Path(__file__).with_suffix(".built")


def platform_supported():
    return {supported}, "why"


cpu_supported = platform_supported

if __name__ == "__main__":
    if sys.argv[1] == "status":
        sys.exit(0 if BUILT.exists() else 1)
    print("building", flush=True)
    time.sleep({seconds})
    BUILT.write_text("")
"""


def _fake_setup(
    directory: Path, name: str, *, supported: bool = True, built: bool = False, seconds: float = 0
) -> Path:
    script = directory / name
    script.write_text(FAKE_SETUP.format(supported=supported, seconds=seconds))
    if built:
        script.with_suffix(".built").write_text("")
    return script


def test_only_missing_environments_this_machine_can_run_are_built(tmp_path: Path) -> None:
    """Missing and runnable: built; already built or not runnable here: left alone."""
    runner = tier_runner()
    _fake_setup(tmp_path, "real_vllm.py")
    _fake_setup(tmp_path, "real_sglang.py", supported=False)
    _fake_setup(tmp_path, "real_llamacpp.py", built=True)
    assert runner.missing_environments(tmp_path) == [tmp_path / "real_vllm.py"]


def test_the_builds_run_one_after_another_and_are_waited_for(tmp_path: Path) -> None:
    """Each missing environment is set up, logged, and complete when wait() returns."""
    runner = tier_runner()
    scripts = [_fake_setup(tmp_path, "real_vllm.py"), _fake_setup(tmp_path, "real_sglang.py")]
    _fake_setup(tmp_path, "real_llamacpp.py", supported=False)
    builds = runner.BuildsAhead(scripts, tmp_path)
    builds.start()
    builds.wait()
    assert runner.missing_environments(tmp_path) == []
    assert len(builds.done) == 2
    assert all(" exit 0 " in line for line in builds.done), builds.done
    for script in scripts:
        assert (tmp_path / f"setup-{script.stem}.log").read_text() == "building\n"


def test_an_interrupted_run_stops_the_build_under_way_and_starts_no_other(tmp_path: Path) -> None:
    """stop() ends the running setup (its whole session) and the next one never starts."""
    runner = tier_runner()
    slow = _fake_setup(tmp_path, "real_vllm.py", seconds=600)
    after = _fake_setup(tmp_path, "real_sglang.py")
    _fake_setup(tmp_path, "real_llamacpp.py", built=True)
    builds = runner.BuildsAhead([slow, after], tmp_path)
    builds.start()
    log = tmp_path / "setup-real_vllm.log"
    deadline = time.monotonic() + 60
    while not (log.exists() and log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    builds.stop()
    builds.wait()
    assert runner.missing_environments(tmp_path) == [slow, after]
    assert not (tmp_path / "setup-real_sglang.log").exists()
    assert " exit -15 " in builds.done[0], builds.done
