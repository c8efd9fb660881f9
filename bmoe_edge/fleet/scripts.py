"""The fixed shell scripts deploy runs on a board, kept as files beside this module (`sh/*.sh`).

Each runs as `sh -s` with the script on stdin (commands.Board.sh): its data — paths, names, prompts — are
its positional arguments ($1, $2, …), set by the framing, never part of the script text, and the
board's login shell (sh, bash, fish, …) sees only the fixed words `sh -s`."""

from __future__ import annotations

from importlib import resources


def _load(name: str) -> str:
    return resources.files(__package__).joinpath("sh", name).read_text(encoding="utf-8")


PY_PROBE = ("import json, os, platform, sys; print('python=' + json.dumps({'machine': platform.machine(), "
             "'version': '%d.%d.%d' % sys.version_info[:3], 'glibc': os.confstr('CS_GNU_LIBC_VERSION') or ''}))")

PROBE = _load("probe.sh")              # $1 sysroot default, $2 python, $3 code, $4.. the exec wrapper
PREPARE = _load("prepare.sh")          # $1 install dir, $2 create|read: releases, current, free space
HASH = _load("hash.sh")                # $1 base, then relative paths: "<index> <sha256>" or "<index> -"
SCAN = _load("scan.sh")                # $1 release dir: its first symlink, or every file outside site*
MKDIRS = _load("mkdirs.sh")            # $1 base, then relative directories
COPY = _load("copy.sh")                # $1 source release, $2 destination, then relative paths
REMOVE_IN = _load("remove_in.sh")      # $1 base, then names to delete under it
INSTALL = _load("install.sh")          # $1 release dir: unpack the wheels into site/
COMMIT = _load("commit.sh")            # $1 partial, $2 final, $3 current: rename into place, synced
DEMOTE = _load("demote.sh")            # $1 final, $2 partial: turn a bad release back into a partial
SWITCH = _load("switch.sh")            # $1 install dir, $2 id: current -> releases/<id>, synced
HANGUP = _load("hangup.sh")            # ARGV…: run it, stop it when the connection goes away
LOCK = _load("lock.sh")                # $1 install dir, $2 wait s, $3 owner, $4 auto|dir: the board lock
WRITE = _load("write.sh")              # $1 path, $2 mode, $3 durable|plain; content on stdin
UNTAR = _load("untar.sh")              # $1 directory; a tar stream of files on stdin
READ = _load("read.sh")                # $1 path: content on stdout, exit 3 when missing
REQUEST = _load("request.sh")          # $1 dir, $2 name, $3 framed script: saved for `sh DIR/NAME`
MARK_FAILED = _load("mark_failed.sh")  # $1 release dir, $2 why: rollback never picks it
SITE_HASH = _load("site_hash.sh")      # $1 release dir: `site <sha256>` of its site/ tree
REQUEST_DIR = _load("request_dir.sh")  # creates and prints the private request directory
CONFIG_HOME = _load("config_home.sh")  # prints ${XDG_CONFIG_HOME:-$HOME/.config}
MODEL_PART = _load("model_part.sh")     # $1 dest, $2 part, $3 n: sha of dest, size and prefix sha of part
MODEL_APPEND = _load("model_append.sh")  # $1 part, $2 bytes kept; stdin appended
MODEL_COMMIT = _load("model_commit.sh")  # $1 part, $2 dest, $3 sha256: verify, rename over dest
SIG_VERIFY = _load("sig_verify.sh")    # $1 allowed_signers, $2 release dir: ssh-keygen -Y verify its manifest
BENCH_START = _load("bench_start.sh")  # $1 run id, ARGV…: ARGV --out RUN/out detached; prints RUN
BENCH_FOLLOW = _load("bench_follow.sh")  # $1 run dir, $2 offset: the log as it grows; exits with the run's code
BENCH_FETCH = _load("bench_fetch.sh")  # $1 run dir: its out/ as a tar stream, exit 3 when there is none
SERVICE = _load("service.sh")          # $1 start|state, $2 unit, $3 unit file: systemd=no|yes, then its state
