# One container NAME published on HOST_PORT, looked at while it runs, then podman rm.
start_web "$NAME" "$HOST_PORT"
pause

step rm podman rm --force --time 0 "$NAME"
step ps podman ps --all --quiet
step netns ls -A /run/netns
