"""A UDP sender for tests that run a script under traffic, run INSIDE a network namespace
(``ip netns exec NS python -m tests.script_traffic DEV``).

It writes Ethernet frames of UDP to port 5001 (``tests.ops_traffic.frame``) on DEV through an
AF_PACKET socket, without pause, until its standard input ends. Each line read from standard
input is answered with the number of frames sent so far (one line), so the caller knows that
frames were sent between two moments; at the end of input it prints the total and exits.
"""

from __future__ import annotations

import errno
import socket
import sys
import threading
import time

from tests.ops_traffic import frame


def _send(dev: str, sent: list[int], stop: threading.Event) -> None:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    data = frame()
    while not stop.is_set():
        try:
            s.sendto(data, socket.MSG_DONTWAIT, (dev, 0x0800))
            sent[0] += 1
        except OSError as e:  # a full queue (ENOBUFS) or socket buffer (EAGAIN): not sent
            if e.errno not in (errno.ENOBUFS, errno.EAGAIN):
                raise
            time.sleep(0.0001)
    s.close()


def main(argv: list[str]) -> int:
    sent = [0]
    stop = threading.Event()
    sender = threading.Thread(target=_send, args=(argv[0], sent, stop))
    sender.start()
    for _ in sys.stdin:
        print(sent[0], flush=True)
    stop.set()
    sender.join()
    print(sent[0], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
