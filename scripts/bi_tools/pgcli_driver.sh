#!/usr/bin/env bash
# pgcli in tmux against `dpproxy demo` (run by run.sh): \dt, \l and tab completion, read off the
# screen as a user would see them. Usage: pgcli_driver.sh PGCLI PORT HOME
set -uo pipefail
PGCLI=$1 PORT=$2 PHOME=$3
SESSION=dpproxy-pgcli
mkdir -p "$PHOME"
tmux kill-session -t "$SESSION" 2>/dev/null
tmux new-session -d -s "$SESSION" -x 200 -y 60 \
    "env HOME=$PHOME PAGER=cat PGPASSWORD=alice-demo $PGCLI -h 127.0.0.1 -p $PORT -U alice -d demo --less-chatty; sleep 30"
screen() { tmux capture-pane -p -t "$SESSION" -S -200; }
wait_for() {  # wait_for PATTERN SECONDS
    for _ in $(seq $(($2 * 2))); do screen | grep -q -E "$1" && return 0; sleep 0.5; done
    return 1
}
step() {  # step NAME PATTERN SECONDS
    if wait_for "$2" "$3"; then echo "PASS pgcli $1"; else
        echo "FAIL pgcli $1: expected /$2/ on the screen, which shows:"; screen | grep -v '^$' | tail -15 | sed 's/^/     /'
    fi
}
step "connect" 'demo>|alice@' 30
tmux send-keys -t "$SESSION" '\dt' Enter
step '\dt lists the exposed tables' 'zip_info' 15
tmux send-keys -t "$SESSION" '\l' Enter
step '\l lists the database' '\| *demo *\|' 15
# -l: literal text (a trailing ; would end tmux's own command).
tmux send-keys -t "$SESSION" -l 'SELECT diagnosis, COUNT(*) FROM patients GROUP BY diagnosis;'
tmux send-keys -t "$SESSION" Enter
step 'a DP query' 'healthy' 15
tmux send-keys -t "$SESSION" -l 'SELECT COUNT(*) FROM vis'
sleep 1
tmux send-keys -t "$SESSION" Tab
step 'tab completion completes a table name' 'FROM visits' 10
tmux send-keys -t "$SESSION" C-c
tmux send-keys -t "$SESSION" -l 'SELECT COUNT(*) FROM patients WHERE inc'
sleep 1
tmux send-keys -t "$SESSION" Tab
step 'tab completion completes a column name' 'WHERE income' 10
tmux send-keys -t "$SESSION" C-c
tmux send-keys -t "$SESSION" C-d
tmux kill-session -t "$SESSION" 2>/dev/null
