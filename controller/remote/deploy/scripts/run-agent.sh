#!/bin/sh
# m1000-fleet agent supervisor, written by `fleetctl deploy`: runs the agent, restarts it
# with back-off when it exits, stops it on SIGTERM.
cd {workdir} || exit 1
echo $$ > {pidfile}
child=
trap 'if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null; wait "$child"; fi; exit 0' TERM INT
delay=1
while :; do
  start=$(date +%s)
  FLEET_CONFIG={config} {command} >> {log} 2>&1 &
  child=$!
  wait "$child"
  code=$?
  child=
  echo "$(date -u +%FT%TZ) agent exited with $code; restarting in $delay s" >> {log}
  [ $(( $(date +%s) - start )) -gt 60 ] && delay=1
  sleep "$delay"
  [ "$delay" -lt 30 ] && delay=$(( delay * 2 ))
done
