# shellcheck shell=bash
# Sourced by the guest halves of the benchmarks (bench/mpi, bench/engine, bench/cables,
# bench/routes).

# sm_btl: Open MPI's shared-memory BTL, by its name in this Open MPI (4.1 calls it vader).
sm_btl() {
    if ompi_info --parsable 2>/dev/null | grep -q '^mca:btl:sm:'; then
        echo sm
    else
        echo vader
    fi
}

# bench_cable PROGRAM: the h0-h1 cable, as dev0 ip0 (h0's end), dev1 peer_ip (h1's
# end) and cable_net (its /30), for perftest and TCP; exits if there is none.
bench_cable() {
    read -r dev0 ip0 peer_ip < <(tbrdma-vc cables h0 | awk -F'\t' '$4 == "h1" { print $3, $6, $7; exit }')
    dev1=$(tbrdma-vc cables h1 | awk -F'\t' '$4 == "h0" { print $3; exit }')
    if [ -z "${dev0:-}" ] || [ -z "$dev1" ]; then
        echo "$1: no cable between h0 and h1" >&2
        tbrdma-vc cables >&2
        exit 1
    fi
    cable_net=$(echo "$ip0" | awk -F. '{ printf "%s.%s.%s.%d/30", $1, $2, $3, int($4 / 4) * 4 }')
}

# perftest_pair TIMEOUT SERVER-LOG TOOL ARGS...: TOOL's server on h1, its client on
# h0 to the peer's cable IPv4 (GID 1, IPv4-mapped RoCEv2), UC with strict mode's
# receive depth, each on a new port.  The client writes to stdout; returns its status.
bench_port=18600
perftest_pair() {
    local limit=$1 slog=$2 tool=$3 spid rc
    shift 3
    bench_port=$((bench_port + 1))
    local args=(-c UC -F -x 1 -p "$bench_port" -r 32 "$@")
    tbrdma-vc exec h1 timeout "$limit" "$tool" -d "$dev1" "${args[@]}" >"$slog" 2>&1 &
    spid=$!
    for _ in $(seq 100); do
        tbrdma-vc exec h1 ss -ltn 2>/dev/null | grep -q ":$bench_port " && break
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.2
    done
    timeout "$limit" "$tool" -d "$dev0" "${args[@]}" "$peer_ip"
    rc=$?
    wait "$spid"
    return "$rc"
}
