"""What an htb class sends of its rate with tc's default burst and with 1 ms of its rate
(W315: from 1gbit tc's default is kept by the kernel as less than one full-size frame).

Usage (as root; needs a C compiler for bench/blast.c)::

    python bench/burst_bench.py                   # 1, 2, 3 and 4gbit, 3 runs each
    python bench/burst_bench.py --rates 1gbit 10gbit --seconds 3

In a fresh network namespace, one end of a veth gets an htb whose one class has the rate as
rate and ceil, over a pfifo; ``blast`` offers it full-size frames as fast as it writes them
(about 6gbit on the 2-core development machine, so rates near that measure the sender), and
the class's sent bytes over the time give what it sent. Each rate is measured with tc's
default burst (what ``tcdsl compile`` writes without ``burst``) and with ``burst`` and
``cburst`` of 1 ms at the rate (what W315 says to write), interleaved.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import uuid
from pathlib import Path

from tcdsl.units import parse_rate

HERE = Path(__file__).parent


def _run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def _sent(ns: str, rate: str, burst: bool, seconds: float, blast: Path) -> float:
    """Mbit/s the class sent of ``rate`` offered full frames for ``seconds``."""
    tc = ("ip", "netns", "exec", ns, "tc")
    subprocess.run([*tc, "qdisc", "del", "dev", "d0", "root"], capture_output=True, check=False)
    extra: list[str] = []
    if burst:
        size = f"{-(-parse_rate(rate) // 8_192_000)}k"
        extra = ["burst", size, "cburst", size]
    _run(*tc, "qdisc", "add", "dev", "d0", "root", "handle", "1:", "htb", "default", "10")
    for parent, classid in (("1:", "1:1"), ("1:1", "1:10")):
        _run(*tc, "class", "add", "dev", "d0", "parent", parent, "classid", classid, "htb",
             "rate", rate, "ceil", rate, *extra)  # fmt: skip
    _run(*tc, "qdisc", "add", "dev", "d0", "parent", "1:10", "pfifo", "limit", "1000")
    _run("ip", "netns", "exec", ns, str(blast), "d0", str(seconds))
    shown = _run(*tc, "-s", "class", "show", "dev", "d0", "classid", "1:10")
    found = re.search(r"Sent (\d+) bytes", shown)
    assert found is not None, shown
    return int(found.group(1)) * 8 / seconds / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", nargs="+", default=["1gbit", "2gbit", "3gbit", "4gbit"])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    blast = folder / "blast"
    _run("cc", "-O2", "-o", str(blast), str(HERE / "blast.c"))
    ns = f"burst-{uuid.uuid4().hex[:8]}"
    _run("ip", "netns", "add", ns)
    try:
        _run("ip", "-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        for dev in ("d0", "d1"):
            _run("ip", "-n", ns, "link", "set", dev, "up")
        print(f"{'rate':>8}  {'tc default burst':>24}  {'1 ms burst':>24}  (Mbit/s sent)")
        for rate in args.rates:
            runs: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.repeat):
                for burst in (False, True):
                    runs[burst].append(_sent(ns, rate, burst, args.seconds, blast))
            cells = [" ".join(f"{v:7.0f}" for v in runs[b]) for b in (False, True)]
            print(f"{rate:>8}  {cells[0]:>24}  {cells[1]:>24}")
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


if __name__ == "__main__":
    main()
