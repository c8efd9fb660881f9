pid=$1
snap() { for t in /proc/$pid/task/*; do echo "$(basename $t) $(cat $t/comm) $(awk '{print $14+$15}' $t/stat) $(grep -E '^(voluntary|nonvoluntary)' $t/status | awk '{print $2}' | tr '\n' ' ')"; done; }
snap > /tmp/diag/s1; sleep 5; snap > /tmp/diag/s2
join <(sort /tmp/diag/s1) <(sort /tmp/diag/s2) | awk '{printf "%s %-16s cpu_ticks %d vol %d invol %d\n", $1, $2, $7-$3, $8-$4, $9-$5}'
