# Shared paths and helpers for the project's scripts. Source it; every value can be overridden.
# shellcheck shell=bash
PSM_TOOLS="${PSM_TOOLS:-/opt/powersync-mdbx}"
PSM_PG16_ROOT="${PSM_PG16_ROOT:-$PSM_TOOLS/pg16}"
PSM_PG16_BIN="${PSM_PG16_BIN:-$PSM_PG16_ROOT/pgserver/pginstall/bin}"
PSM_PG15_BIN="${PSM_PG15_BIN:-/usr/lib/postgresql/15/bin}"
# Unprivileged system user that runs throwaway clusters when the tests run as root.
PSM_TEST_USER="${PSM_TEST_USER:-powersync_test}"
PGRX_VERSION="0.18.1"
PGSERVER_VERSION="0.1.4"
export PSM_TOOLS PSM_PG16_ROOT PSM_PG16_BIN PSM_PG15_BIN PSM_TEST_USER
export PATH="$HOME/.cargo/bin:$PATH"

# A free loopback port below the kernel's ephemeral range: a port taken from that range can be
# held by an outgoing connection (a walsender's client) when the listener starts, and its bind fails.
free_port() {
  python3 - <<'PY'
import random, socket
end = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
while True:
    port = random.randrange(10000, end)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        print(port)
        break
    except OSError:
        pass
    finally:
        s.close()
PY
}
