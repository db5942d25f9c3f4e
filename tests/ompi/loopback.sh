#!/bin/sh
# One host, no RDMA: the host engine runs on a stand-in device that opens
# but makes no queue pair, so every message between this host's ranks goes
# from ring to ring inside the engine, and a rank's messages to itself
# through tbrdma's loopback.  Both belong to the host module, the one that
# reaches every rank (the cable's module reaches only other hosts).  With
# tbrdma and self alone, ob1 carries everything over it, and osc/rdma runs
# one-sided MPI straight on its put, get and atomics (Open MPI 4.1 has no
# other way; 5.0 says which BTL it chose).  Every byte and every atomic
# result is checked by tb_mpitests.
. "$(dirname "$0")/common.sh"

[ -n "${TB_MPICC:-}" ] && [ -x "$TB_MPICC" ] || { echo "mpicc not found: skipped"; exit 77; }
"$TB_MPICC" -O2 -o "$scratch/tb_mpitests" "$TB_SRCDIR/tests/mpi/tb_mpitests.c" ||
    { echo "mpicc failed"; exit 99; }
fake="$TB_BUILDDIR/tests/unit/.libs/libfakeverbs.so"
engine="$TB_BUILDDIR/engine/tbrdma-engine"
[ -x "$engine" ] || { echo "engine not built"; exit 99; }
if [ -n "${tb_asan_rt:-}" ]; then
    # A sanitized engine carries its own ASan runtime: the preloaded one the
    # ranks need would clash with it.
    printf '#!/bin/sh\nunset LD_PRELOAD\nexec "%s" "$@"\n' "$engine" > "$scratch/engine"
    chmod +x "$scratch/engine"
    engine=$scratch/engine
fi

# loopback NP TESTS...: output in $scratch/np$NP.out
loopback() {
    np=$1
    shift
    timeout 300 "$ompi_bindir/mpirun" --oversubscribe --bind-to none -np "$np" \
        --mca pml ob1 --mca btl tbrdma,self --mca btl_tbrdma_path engine \
        --mca btl_tbrdma_verbs_library "$fake" --mca btl_tbrdma_engine_path "$engine" \
        --mca osc rdma --mca osc_base_verbose 40 --mca btl_base_verbose 20 \
        -x TB_FAKE_VERBS="rdma_en0:open:127.0.0.1" \
        "$scratch/tb_mpitests" -m 1048576 "$@" > "$scratch/np$np.out" 2>&1
}

for np in 2 3; do
    if loopback "$np" pingpong storm anysource coll osc atomics manyrma &&
        grep -q "0 failed" "$scratch/np$np.out"; then
        ok "$np ranks of one host over the engine's ring-to-ring path: point-to-point," \
            "collectives, one-sided, atomics, 100000 puts and gets in one epoch"
    else
        not_ok "$np ranks of one host over the engine's loopback (status $?)"
        cat "$scratch/np$np.out"
        continue
    fi
    # Every rank's host module made an endpoint for every other rank; the
    # cable's module none.
    nh=$(grep -c "host module, rdma_en0: rank [0-9]* of this host" "$scratch/np$np.out")
    nc=$(grep -c "btl:tbrdma: rdma_en0: rank\|btl:tbrdma: rdma_en0 reaches" "$scratch/np$np.out")
    if [ "$nh" -eq $((np * (np - 1))) ] && [ "$nc" -eq 0 ]; then
        ok "$np ranks: the host modules carried it ($nh endpoints), no cable's module"
    else
        not_ok "$np ranks: host modules made $nh endpoints (want $((np * (np - 1)))), the" \
            "cable's modules $nc (want 0)"
    fi
    if [ "$TB_OMPI_BTL_VERSION" = 330 ]; then
        if grep -q "accelerated_query: selected btl: tbrdma" "$scratch/np$np.out" &&
            ! grep -q "falling back on active-message" "$scratch/np$np.out"; then
            ok "$np ranks: osc/rdma chose tbrdma itself"
        else
            not_ok "$np ranks: osc/rdma did not choose tbrdma"
            grep "accelerated\|active-message" "$scratch/np$np.out"
        fi
    fi
done
finish
