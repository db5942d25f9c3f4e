#!/bin/sh
# Without a usable RDMA device, tbrdma steps aside quietly when another
# network BTL can carry the job, and explains itself when none can; bad
# parameters are refused with a clear message.  Never a crash or a hang.
. "$(dirname "$0")/common.sh"

[ -n "${TB_MPICC:-}" ] && [ -x "$TB_MPICC" ] || { echo "mpicc not found: skipped"; exit 77; }
"$TB_MPICC" -o "$scratch/hello" "$TB_SRCDIR/tests/ompi/hello.c" || { echo "mpicc failed"; exit 99; }
fake="$TB_BUILDDIR/tests/unit/.libs/libfakeverbs.so"

# run NAME EXPECTED-STATUS(0|nonzero) MCA-ARGS...: output in $scratch/NAME.out
#
# Open MPI 4.1's mpirun, which loads no BTL, can itself die of SIGSEGV while
# a job aborts: its PMIx thread forwards a rank's show_help message
# (pmix_server_log_fn calling orte_rml.send_buffer_nb off ORTE's event thread)
# as ORTE tears down.  That crash, and only that one, is run again, twice at
# most; a rank's crash, or the launcher's every time, still fails.
run() {
    name=$1 expect=$2
    shift 2
    tries=0
    while :; do
        timeout 120 "$ompi_bindir/mpirun" --oversubscribe -np 2 "$@" "$scratch/hello" \
            > "$scratch/$name.out" 2>&1
        status=$?
        tries=$((tries + 1))
        [ "$status" -eq 139 ] && [ "$tries" -lt 3 ] &&
            grep -q '(pmix_server_log_fn+' "$scratch/$name.out" &&
            ! grep -q 'exited on signal\|mca_btl_tbrdma' "$scratch/$name.out" || break
        echo "note: $name: Open MPI's mpirun crashed in pmix_server_log_fn while the job aborted" \
             "(its own defect; mpirun loads no BTL): run again"
    done
    if [ "$status" -eq 124 ]; then
        not_ok "$name: hung (killed after 120 s)"
        return 1
    fi
    if [ "$status" -ge 128 ]; then
        not_ok "$name: crashed (status $status)"; cat "$scratch/$name.out"
        return 1
    fi
    if { [ "$expect" = 0 ] && [ "$status" -ne 0 ]; } || { [ "$expect" != 0 ] && [ "$status" -eq 0 ]; }; then
        not_ok "$name: exit status $status, expected $expect"; cat "$scratch/$name.out"
        return 1
    fi
    return 0
}

expect_text() {
    if grep -q "$2" "$scratch/$1.out"; then
        ok "$1: says \"$2\""
    else
        not_ok "$1: output lacks \"$2\""; cat "$scratch/$1.out"
    fi
}

expect_no_text() {
    if grep -q "$2" "$scratch/$1.out"; then
        not_ok "$1: output has \"$2\""; cat "$scratch/$1.out"
    else
        ok "$1: quiet about \"$2\""
    fi
}

export TB_FAKE_VERBS=""
if run with_tcp 0 --mca btl tbrdma,self,tcp --mca btl_tbrdma_verbs_library "$fake"; then
    expect_text with_tcp "hello: 2 ranks, all data correct"
    expect_no_text with_tcp "tbrdma"
fi

if run alone nonzero --mca btl tbrdma,self --mca btl_tbrdma_verbs_library "$fake"; then
    expect_text alone "The tbrdma transport (RDMA over Thunderbolt) was requested"
    expect_text alone "Reason: no RDMA device"
fi

if run no_library nonzero --mca btl tbrdma,self --mca btl_tbrdma_verbs_library /nonexistent/libibverbs.so.1; then
    expect_text no_library "cannot load the verbs library /nonexistent/libibverbs.so.1"
fi

if run filtered_out nonzero --mca btl tbrdma,self --mca btl_tbrdma_verbs_library "$fake" \
       --mca btl_tbrdma_if_include "mlx*" -x TB_FAKE_VERBS="rdma_en0:active:127.0.0.1"; then
    expect_text filtered_out "passes btl_tbrdma_if_include/if_exclude"
fi

if run bad_param 0 --mca btl tbrdma,self,tcp --mca btl_tbrdma_recv_depth 64; then
    expect_text bad_param "btl_tbrdma_recv_depth = 64: must be between 2 and 32"
    expect_text bad_param "hello: 2 ranks, all data correct"
fi

if run bad_pool 0 --mca btl tbrdma,self,tcp --mca btl_tbrdma_free_list_max 4; then
    expect_text bad_pool "btl_tbrdma_free_list_max = 4 either -1 (no limit) or at least free_list_num"
    expect_text bad_pool "hello: 2 ranks, all data correct"
fi

if run bad_lists 0 --mca btl tbrdma,self,tcp --mca btl_tbrdma_if_include a --mca btl_tbrdma_if_exclude b; then
    expect_text bad_lists "set only one of them"
fi

# A device that is listed and up but cannot be opened for traffic (the
# stand-in library refuses protection domains): tbrdma says so, steps aside,
# and the job runs over tcp.
if run fake_device 0 --mca btl tbrdma,self,tcp --mca btl_tbrdma_verbs_library "$fake" \
       -x TB_FAKE_VERBS="rdma_en0:active:127.0.0.1;rdma_en1:down:127.0.0.1"; then
    expect_text fake_device "not using rdma_en0: cannot open rdma_en0 for traffic"
    expect_no_text fake_device "not using rdma_en1"
    expect_text fake_device "hello: 2 ranks, all data correct"
fi
finish
