"""Deploy: bundles onto boards over SSH (fabric), fleets, rollback, status, and gates/generate run on a
board through its current release. Above boards (it reads bundles and profiles); never imported by
engine, synthetic or boards.

The steps (probe, lock, upload, trust, install, services, releases, onboard) are functions over a
`commands.Board`; below them: report (the log, a host's result, the table), state (the install dir),
systemd (unit text), parallel (many hosts). The connection: targets -> remote (+ host_keys) -> commands.
"""
