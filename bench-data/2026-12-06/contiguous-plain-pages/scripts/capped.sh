# capped.sh: the process joins the 40% cap's cgroup, then runs ttft.py (the cache auto: a budget below the experts)
echo $$ > /sys/fs/cgroup/memory/ttftcap/tasks
sync; echo 1 > /proc/sys/vm/drop_caches
exec /work/main/.venv/bin/python /tmp/diag/ttft.py "$@"
