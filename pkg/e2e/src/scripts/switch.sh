# A node switched in place while containers run: OLD is attached by the plugins installed first,
# NEW by the ones installed at the first pause, and each is removed by the other set.
start_web "$OLD" "$OLD_PORT"
pause

start_web "$NEW" "$NEW_PORT"
step rm podman rm --force --time 0 "$OLD"
pause

step rm podman rm --force --time 0 "$NEW"
step ps podman ps --all --quiet
step netns ls -A /run/netns
