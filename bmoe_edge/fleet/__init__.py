"""Deploy: bundles onto boards over SSH (fabric), fleets, rollback, status, and gates/generate run on a
board through its current release. Above boards (it reads bundles and profiles); never imported by
engine, synthetic or boards.
"""
