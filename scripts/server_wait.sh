# Sourced by the measuring scripts: wait for a server they started.
#
# wait_for_server PID PORT LOG TRIES: waits until 127.0.0.1:PORT accepts
# (polling every 0.05 s, at most TRIES times); exits the script, showing
# LOG, if the server PID has exited instead.
wait_for_server() {
  local pid=$1 port=$2 log=$3 tries=$4
  for _ in $(seq 1 "$tries"); do
    (echo > /dev/tcp/127.0.0.1/"$port") 2> /dev/null && break
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.05
  done
  if ! kill -0 "$pid" 2> /dev/null; then
    echo "the server exited at start:" >&2
    cat "$log" >&2
    exit 1
  fi
}
