"""Tune: measure the machine a board is (measure), choose its engine settings (rules), write them as a
user profile (user_profile); here (local) or on a board over SSH (over_ssh).

Above boards (the profile it extends), bench (its board-side measuring) and fleet (a board's release
runs it); below the CLI. Board side: measure, rules, user_profile and local run on a board.
"""
