#!/usr/bin/env python3
"""Tests of hpl-config/hpl-dat, the HPL.dat generator (run by make check)."""

import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
HPL_DAT = os.path.join(HERE, "..", "..", "hpl-config", "hpl-dat")
GIB = 1 << 30
PRESETS = ["mac-studio-m3-ultra-512", "mac-studio-m4-max-128",
           "mac-mini-m4-pro-64", "vcluster"]


def run(*args):
    return subprocess.run([sys.executable, HPL_DAT] + [str(a) for a in args],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True)


def parse(text):
    """HPL.dat's values by their comment ("Ns", "Ps", ...)."""
    lines = text.splitlines()
    values = {}
    for line in lines[2:]:
        value, comment = line.split(None, 1)
        values[comment] = value
    return lines, values


def generate(*args):
    r = run(*args)
    if r.returncode != 0:
        raise AssertionError("hpl-dat %s failed (%d): %s" % (args, r.returncode, r.stderr))
    return parse(r.stdout)


def near_square(ranks):
    """The expected grid, found the slow way."""
    pairs = [(p, ranks // p) for p in range(1, ranks + 1) if ranks % p == 0]
    return min(((p, q) for p, q in pairs if p <= q), key=lambda pq: pq[1] - pq[0])


class Sizing(unittest.TestCase):
    def check(self, hosts, mem_gib, share, nb, rph=1):
        _, v = generate("--hosts", hosts, "--mem-gib", mem_gib, "--cores", rph,
                        "--share", share, "--nb", nb)
        n = int(v["Ns"])
        limit = float(share) * hosts * mem_gib * GIB
        self.assertEqual(int(v["NBs"]), nb)
        self.assertEqual(n % nb, 0, "N %d not a multiple of NB %d" % (n, nb))
        self.assertLessEqual(8 * n * n, limit, "N %d does not fit" % n)
        self.assertGreater(8 * (n + nb) ** 2, limit, "N %d is not the largest" % n)

    def test_n_fits_memory_and_is_maximal(self):
        for hosts in (1, 2, 3, 16):
            for mem_gib in (8, 64, 512):
                for share in ("0.5", "0.8", "1"):
                    for nb in (64, 192):
                        with self.subTest(hosts=hosts, mem=mem_gib, share=share, nb=nb):
                            self.check(hosts, mem_gib, share, nb)

    def test_known_value(self):
        # 2 hosts x 128 GiB x 0.8 = 204.8 GiB: sqrt(204.8 GiB / 8) = 165794.6
        _, v = generate("--hosts", 2, "--mem-gib", 128, "--cores", 12)
        self.assertEqual(v["Ns"], str(165794 - 165794 % 192))
        self.assertEqual(v["NBs"], "192")

    def test_grid(self):
        for ranks in range(1, 65):
            with self.subTest(ranks=ranks):
                _, v = generate("--hosts", 1, "--mem-gib", 512, "--cores", ranks)
                p, q = int(v["Ps"]), int(v["Qs"])
                self.assertEqual(p * q, ranks)
                self.assertLessEqual(p, q)
                self.assertEqual((p, q), near_square(ranks))

    def test_ranks_per_host(self):
        _, v = generate("--hosts", 4, "--mem-gib", 64, "--cores", 10, "--ranks-per-host", 3)
        self.assertEqual((v["Ps"], v["Qs"]), ("3", "4"))
        _, v = generate("--hosts", 3, "--mem-gib", 64, "--cores", 8)
        self.assertEqual((v["Ps"], v["Qs"]), ("4", "6"))

    def test_n_override(self):
        _, v = generate("--hosts", 2, "--mem-gib", 8, "--cores", 2, "--nb", 128, "--n", 4096)
        self.assertEqual(v["Ns"], "4096")


class Format(unittest.TestCase):
    def test_standard_hpl_23_file(self):
        lines, v = generate("--hosts", 2, "--mem-gib", 64, "--cores", 4)
        self.assertEqual(len(lines), 31)
        self.assertEqual(lines[0], "HPLinpack benchmark input file")
        expected = {
            "device out (6=stdout,7=stderr,file)": "6",
            "# of problems sizes (N)": "1",
            "# of NBs": "1",
            "PMAP process mapping (0=Row-,1=Column-major)": "0",
            "# of process grids (P x Q)": "1",
            "threshold": "16.0",
            "# of panel fact": "1",
            "PFACTs (0=left, 1=Crout, 2=Right)": "2",
            "NBMINs (>= 1)": "4",
            "NDIVs": "2",
            "RFACTs (0=left, 1=Crout, 2=Right)": "1",
            "BCASTs (0=1rg,1=1rM,2=2rg,3=2rM,4=Lng,5=LnM)": "1",
            "DEPTHs (>=0)": "1",
            "SWAP (0=bin-exch,1=long,2=mix)": "2",
            "swapping threshold": "64",
            "L1 in (0=transposed,1=no-transposed) form": "1",
            "U  in (0=transposed,1=no-transposed) form": "1",
            "Equilibration (0=no,1=yes)": "1",
            "memory alignment in double (> 0)": "8",
        }
        for comment, value in expected.items():
            self.assertEqual(v.get(comment), value, comment)
        # HPL reads the values in this order, one line each.
        order = [line.split(None, 1)[1] for line in lines[2:]]
        self.assertEqual(order[3], "Ns")
        self.assertEqual(order[5], "NBs")
        self.assertEqual(order[8:10], ["Ps", "Qs"])

    def test_out_file_equals_stdout(self):
        args = ["--hosts", 2, "--preset", "mac-mini-m4-pro-64"]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "HPL.dat")
            r = run(*(args + ["--out", path]))
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(path) as f:
                self.assertEqual(f.read(), run(*args).stdout)
            self.assertEqual(os.listdir(d), ["HPL.dat"])


class Presets(unittest.TestCase):
    def test_every_preset(self):
        for preset in PRESETS:
            for hosts in (1, 2, 3, 4, 8):
                with self.subTest(preset=preset, hosts=hosts):
                    _, v = generate("--preset", preset, "--hosts", hosts)
                    n, nb = int(v["Ns"]), int(v["NBs"])
                    p, q = int(v["Ps"]), int(v["Qs"])
                    self.assertEqual(n % nb, 0)
                    self.assertGreaterEqual(n, nb * q)
                    self.assertLessEqual(p, q)
                    self.assertEqual((p, q), near_square(p * q))

    def test_apple_presets(self):
        for preset, mem_gib, cores in (("mac-studio-m3-ultra-512", 512, 24),
                                       ("mac-studio-m4-max-128", 128, 12),
                                       ("mac-mini-m4-pro-64", 64, 10)):
            with self.subTest(preset=preset):
                _, v = generate("--preset", preset, "--hosts", 2)
                n = int(v["Ns"])
                self.assertEqual(v["NBs"], "192")
                self.assertEqual(int(v["Ps"]) * int(v["Qs"]), 2 * cores)
                self.assertLessEqual(8 * n * n, 0.8 * 2 * mem_gib * GIB)
                self.assertGreater(8 * (n + 192) ** 2, 0.8 * 2 * mem_gib * GIB)

    def test_preset_values_can_be_overridden(self):
        _, v = generate("--preset", "mac-studio-m4-max-128", "--hosts", 2,
                        "--nb", 256, "--ranks-per-host", 1, "--share", "0.5")
        self.assertEqual(v["NBs"], "256")
        self.assertEqual((v["Ps"], v["Qs"]), ("1", "2"))
        n = int(v["Ns"])
        self.assertLessEqual(8 * n * n, 0.5 * 2 * 128 * GIB)

    def test_vcluster_grids(self):
        # What tests/hpl/guest-hpl-check runs: one rank per host.
        for hosts, grid in ((2, ("1", "2")), (4, ("2", "2"))):
            _, v = generate("--preset", "vcluster", "--hosts", hosts)
            self.assertEqual((v["Ps"], v["Qs"]), grid)
            self.assertLessEqual(int(v["Ns"]), 4096)  # minutes under TCG, not hours


class BadInput(unittest.TestCase):
    CASES = [
        ["--hosts", 0, "--mem-gib", 64, "--cores", 4],
        ["--hosts", -2, "--mem-gib", 64, "--cores", 4],
        ["--hosts", "2.5", "--mem-gib", 64, "--cores", 4],
        ["--hosts", "two", "--mem-gib", 64, "--cores", 4],
        ["--mem-gib", 64, "--cores", 4],
        ["--hosts", 2, "--cores", 4],
        ["--hosts", 2, "--mem-gib", 64],
        ["--hosts", 2, "--mem-gib", 0, "--cores", 4],
        ["--hosts", 2, "--mem-gib", -1, "--cores", 4],
        ["--hosts", 2, "--mem-gib", 64, "--cores", 0],
        ["--hosts", 2, "--mem-gib", 64, "--cores", "1.5"],
        ["--hosts", 2, "--mem-gib", 64, "--cores", 4, "--ranks-per-host", 0],
        ["--hosts", 2, "--mem-gib", 64, "--cores", 4, "--share", 0],
        ["--hosts", 2, "--mem-gib", 64, "--cores", 4, "--share", "1.01"],
        ["--hosts", 2, "--mem-gib", 64, "--cores", 4, "--share", "-0.5"],
        ["--hosts", 2, "--mem-gib", 64, "--cores", 4, "--nb", 0],
        ["--hosts", 2, "--mem-gib", 64, "--cores", 4, "--nb", "19.2"],
        # Too little memory for one NB x NB block per rank.
        ["--hosts", 2, "--mem-gib", "0.001", "--cores", 4],
        ["--hosts", 16, "--mem-gib", 1, "--cores", 64, "--nb", 2048],
        ["--hosts", 2, "--mem-gib", 64, "--cores", 4, "--n", 1000],     # not a multiple of NB
        ["--hosts", 2, "--mem-gib", 1, "--cores", 4, "--n", 192000],    # does not fit
        ["--hosts", 2, "--preset", "no-such-machine"],
        ["--hosts", 2, "--preset", "vcluster", "--no-such-option"],
    ]

    def test_exit_2_one_line_no_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "HPL.dat")
            for case in self.CASES:
                with self.subTest(args=case):
                    r = run(*(case + ["--out", path]))
                    self.assertEqual(r.returncode, 2)
                    self.assertEqual(r.stdout, "")
                    self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
                    self.assertTrue(r.stderr.startswith("hpl-dat: error: "), r.stderr)
                    self.assertEqual(os.listdir(d), [])

    def test_nothing_on_stdout_without_out(self):
        r = run("--hosts", 0, "--preset", "vcluster")
        self.assertEqual((r.returncode, r.stdout), (2, ""))
        self.assertIn("--hosts", r.stderr)


if __name__ == "__main__":
    unittest.main()
