#!/usr/bin/env bash
# Installs the Debian packages that the real-service test tiers need, when missing.
# Needs root (CI runs as root). Without root it says what is missing and goes on:
# the tests that need a missing program skip with a reason naming it.
set -u
need=()
command -v redis-server >/dev/null || need+=(redis-server)
command -v redis-sentinel >/dev/null || need+=(redis-sentinel)
command -v prometheus >/dev/null || need+=(prometheus)
command -v promtool >/dev/null || need+=(prometheus)
command -v prometheus-pushgateway >/dev/null || need+=(prometheus-pushgateway)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
command -v scp >/dev/null || need+=(openssh-client)
command -v chromium >/dev/null || need+=(chromium)
command -v ip >/dev/null || need+=(iproute2)
command -v rsync >/dev/null || need+=(rsync)
command -v iptables >/dev/null || need+=(iptables)  # the lossy-link test (statistic match)
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v go >/dev/null || need+=(golang-go)  # tests/metrics/expandenv: provisioning files as Grafana expands them
command -v cmake >/dev/null || need+=(cmake)  # make engine / make test: llama-server from the pinned llama.cpp source
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
command -v faketime >/dev/null || need+=(faketime)  # a controller whose clock is an hour behind (reservations)
command -v ser2net >/dev/null || need+=(ser2net)  # a module's serial console on a raw TCP port (issue 49)
command -v socat >/dev/null || need+=(socat)  # the serial line ser2net serves: a pty pair
# the shared run history's tests (tests/history): Debian's server, whose programs are not on PATH
[ -x /usr/lib/postgresql/15/bin/postgres ] || need+=(postgresql)
[ ${#need[@]} -eq 0 ] && exit 0
mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
if [ "$(id -u)" != 0 ]; then
  echo "system-deps: not root, cannot install: ${need[*]} (tests needing them will skip, saying so)" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}"
