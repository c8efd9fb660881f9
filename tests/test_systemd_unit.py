"""The serve unit under a real systemd (issue 44, item 9; bmoe_edge/proof/systemd_check.py, docs/deploy.md
"The unit under a real systemd"): the full campaign boots one in a systemd-nspawn container; the suite
keeps what that run taught about systemd's answers."""

from __future__ import annotations

import pytest

from bmoe_edge.fleet import services
from bmoe_edge.proof import systemd_check

UNIT = "bmoe-edge-serve.service"
# `systemctl show` after a real crash loop (five kill -9s, systemd 252 in the container): the refused
# restart keeps the crash's result; Result=start-limit-hit never appears.
CRASH_LOOP_STATE = {"ActiveState": "failed", "SubState": "failed", "Result": "signal", "NRestarts": "5",
                    "MainPID": "0", "ExecMainStatus": "9"}
# ... and after fifteen refused schemas on the server before c142c1e (each three made it exit 1).
CLIENT_LOOP_STATE = {"ActiveState": "failed", "SubState": "failed", "Result": "exit-code", "NRestarts": "5",
                     "MainPID": "0", "ExecMainStatus": "1"}


@pytest.mark.parametrize("state", [CRASH_LOOP_STATE, CLIENT_LOOP_STATE], ids=["killed", "exited"])
def test_status_names_the_start_limit_as_a_real_crash_loop_leaves_it(state: dict[str, str]) -> None:
    shown = services.state_text(state, UNIT)
    assert shown.startswith("failed (failed), 5 restarts; stopped by systemd's start limit"), shown
    assert f"reset-failed {UNIT}" in shown


def test_a_failure_below_the_limit_is_not_called_the_limit() -> None:
    # a unit that failed once and is waiting to restart, or was stopped with restarts behind it
    assert "start limit" not in services.state_text({"ActiveState": "activating", "SubState": "auto-restart",
                                                     "Result": "signal", "NRestarts": "4"}, UNIT)
    assert "start limit" not in services.state_text({"ActiveState": "failed", "SubState": "failed",
                                                     "Result": "exit-code", "NRestarts": "1"}, UNIT)


def test_the_launcher_of_the_check_keeps_its_arguments_apart() -> None:
    text = systemd_check.LAUNCHER.format(site="/s", source="")
    assert text.splitlines()[-1].endswith('"/s" "" "$@"')
    assert "'" not in text.split("-c '", 1)[1].rsplit("'", 1)[0]   # the program holds no quote of sh's


@pytest.mark.full_campaign
def test_the_serve_unit_under_a_real_systemd() -> None:
    """Boots systemd in a container (root; debootstrap's tree from Debian's archive the first time, then
    cached): the unit serves, its sandbox leaves the engine's calls working as outside it, three refused
    schemas do not restart it, five kills stop it at the start limit and reset-failed starts it again."""
    reason = systemd_check.missing()
    if reason:
        pytest.skip(f"no systemd to boot here: {reason}")
    report = systemd_check.run()
    serving, baseline = report["serving"], report["baseline"]
    assert report["system"]["is_system_running"] in ("running", "degraded")
    assert serving["start_out"].startswith("systemd=yes") and serving["health"][0] == 200
    assert serving["completion"]["usage"]["completion_tokens"] > 0
    engine = serving["engine"]
    assert not serving["filter_kills"] and serving["state"]["NRestarts"] == "0"
    # the sandbox is there ...
    assert engine["seccomp_filters"] > baseline["seccomp_filters"] and engine["no_new_privs"] == 1
    assert engine["home_seen"].split() == ["bmoe-edge", "models"]
    assert engine["devices_seen"] < baseline["devices_seen"]
    # ... and the engine does under it what it does without it
    assert engine["model_fds_o_direct"] == baseline["model_fds_o_direct"] > 0
    assert engine["threads"] == baseline["threads"] > 1
    for flag in ("vmas_nohugepage", "vmas_hugepage", "vmas_dontfork"):
        assert abs(engine[flag] - baseline[flag]) <= 2, flag
    assert engine["expert_bytes_read"] > 0
    (client,) = report["client_failures"]
    assert client["statuses"] == [400, 400, 400]
    assert client["after"]["NRestarts"] == client["before"]["NRestarts"]
    assert client["after"]["MainPID"] == client["before"]["MainPID"]
    crash = report["crash_loop"]
    assert len(crash["kills"]) == services.START_LIMIT_BURST
    assert services.stopped_by_start_limit(crash["state"])
    assert any("Start request repeated too quickly" in ln for ln in crash["status"])
    assert crash["after_reset"]["ActiveState"] == "active"
