#!/usr/bin/env bash
# A throwaway PostgreSQL for the tests and benchmarks (Debian's postgresql package).
#
#   scripts/postgres.sh install      apt-get install postgresql when missing (quick no-op otherwise)
#   scripts/postgres.sh start DIR    initdb into DIR/data, start a server on a free localhost port
#                                    and a unix socket in DIR, create database "flm"; prints its
#                                    URL (socket, trust auth: the URL holds no secret)
#   scripts/postgres.sh stop DIR     stop the server of DIR by its pid file
#
# TCP connections need the password of user postgres, kept in DIR/password (mode 600), so tests
# can exercise password URLs without the script ever printing one. The server runs as the
# "postgres" user when started by root (postgres refuses to run as root). Durability is off
# (fsync=off): this cluster holds test data only.
set -euo pipefail

die() { echo "postgres.sh: $*" >&2; exit 1; }

pg_bindir() {
    local dir
    # Newest major version first.
    for dir in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V -r); do
        if [[ -x "$dir/pg_ctl" ]]; then
            echo "$dir"
            return 0
        fi
    done
    return 1
}

cmd_install() {
    if pg_bindir >/dev/null; then
        return 0
    fi
    [[ $(id -u) -eq 0 ]] || die "install needs root (apt-get install postgresql)"
    apt-get update -qq
    # The package's post-install tries to start a system cluster; that may fail in a container
    # and does not matter here, since the tests start their own.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        postgresql >/dev/null || pg_bindir >/dev/null || die "apt-get install postgresql failed"
    pg_bindir >/dev/null || die "postgresql installed but no pg_ctl under /usr/lib/postgresql"
}

# Run a command as the server's owner: "postgres" when we are root, else ourselves.
as_owner() {
    if [[ $(id -u) -eq 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

cmd_start() {
    local bin dir port
    bin=$(pg_bindir) || die "PostgreSQL is not installed: run '$0 install' first"
    [[ -n ${1:-} ]] || die "usage: $0 start DIR"
    dir=$(mkdir -p "$1" && cd "$1" && pwd)
    [[ ! -e $dir/data/postmaster.pid ]] || die "a server already runs in $dir (stop it first)"
    if [[ $(id -u) -eq 0 ]]; then
        chown postgres: "$dir"
        chmod 700 "$dir"
        as_owner test -w "$dir" || die "user postgres cannot write $dir (a parent folder is private?)"
    fi
    (( ${#dir} < 90 )) || die "$dir is too long for a unix socket path; use a shorter folder"

    if [[ ! -s $dir/data/PG_VERSION ]]; then
        (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=\n' > "$dir/password")
        [[ $(id -u) -ne 0 ]] || chown postgres: "$dir/password"
        as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth-local=trust \
            --auth-host=scram-sha-256 --pwfile="$dir/password" -E UTF8 --no-sync \
            >"$dir/initdb.log" 2>&1 || die "initdb failed; see $dir/initdb.log"
    fi
    port=$(free_port)
    echo "$port" >"$dir/port"
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 start -o \
        "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
        >/dev/null || die "server did not start; see $dir/postgres.log"
    if ! as_owner "$bin/psql" -h "$dir" -p "$port" -U postgres -d postgres -tAq \
            -c "SELECT 1 FROM pg_database WHERE datname = 'flm'" | grep -q 1; then
        as_owner "$bin/createdb" -h "$dir" -p "$port" -U postgres flm
    fi
    echo "postgresql://postgres@/flm?host=$dir&port=$port"
}

cmd_stop() {
    local bin dir pidfile pid
    [[ -n ${1:-} ]] || die "usage: $0 stop DIR"
    dir=$(cd "$1" 2>/dev/null && pwd) || return 0
    pidfile=$dir/data/postmaster.pid
    [[ -s $pidfile ]] || return 0
    pid=$(head -n 1 "$pidfile")
    if bin=$(pg_bindir); then
        as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null 2>&1 && return 0
    fi
    # pg_ctl missing or failed: signal the postmaster named by the pid file (fast shutdown).
    if kill -0 "$pid" 2>/dev/null; then
        kill -INT "$pid"
        for _ in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || return 0
            sleep 0.1
        done
        die "postmaster $pid did not stop"
    fi
}

case ${1:-} in
    install) cmd_install ;;
    start) shift; cmd_start "$@" ;;
    stop) shift; cmd_stop "$@" ;;
    *) die "usage: $0 install | start DIR | stop DIR" ;;
esac
