# $1 start|state, $2 unit name, $3 (start) the rendered unit file. Prints `systemd=no` when the board does
# not run systemd (PID 1 is something else: a container, the emulated board); else, after starting it,
# the unit's state (`systemctl show`). Starting needs root or passwordless sudo (exit 21 otherwise).
act=$1; unit=$2
if [ ! -d /run/systemd/system ]; then echo "systemd=no"; exit 0; fi
if [ "$act" = start ]; then
  if [ "$(id -u)" -eq 0 ]; then as_root=
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then as_root="sudo -n"
  else echo "installing a system service needs root or passwordless sudo for $(id -un)" >&2; exit 21; fi
  $as_root install -m 0644 -- "$3" "/etc/systemd/system/$unit" || exit 1
  $as_root systemctl daemon-reload || exit 1
  $as_root systemctl enable --quiet -- "$unit" || exit 1
  $as_root systemctl reset-failed -- "$unit" 2>/dev/null   # a unit its start limit stopped starts again
  $as_root systemctl restart -- "$unit" || exit 1
fi
echo "systemd=yes"
systemctl show -p ActiveState -p SubState -p NRestarts -p Result -- "$unit"
