"""Link-layer overhead: what a packet costs on the wire, the named encapsulations (presets), and
the two ways the kernel accounts for it, a root qdisc's size table (tc's ``stab``) and cake's
own overhead compensation.

tcdsl gives ``overhead N`` ONE meaning wherever it is written: N bytes are added to the packet's
network-layer (IP) size, then ``mpu`` rounds it up, then an ATM link pays whole 53-byte cells
for every 48 bytes (or part), a PTM link one byte per 64 (or part). That is cake's meaning when
it is given an overhead (it strips the MAC header first). A size table adds its overhead to
``skb->len`` instead, which on an Ethernet device (and on an IFB fed from one by mirred)
includes the 14-byte Ethernet header: tcdsl writes the stab overhead 14 bytes smaller, so that
the same preset costs the same bytes on the wire whether cake or a stab charges it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from tcdsl.ir import Overhead

LinkLayerName = Literal["ethernet", "atm", "ptm"]

ETHERNET_HEADER = 14
"""The MAC header that ``skb->len`` holds on an Ethernet device (destination, source, type)."""
ATM_CELL = 53
ATM_PAYLOAD = 48

OVERHEAD_RANGE = (-64, 256)
"""What tc's cake takes (q_cake.c: "valid range is -64 to 256"); tcdsl keeps stab to it too."""
MPU_RANGE = (0, 256)
"""What tc's cake takes for ``mpu`` (q_cake.c); tcdsl keeps stab to it too."""
STAB_MTU_RANGE = (1, 65535)
STAB_TSIZE_RANGE = (1, 16384)
"""A size table rides in tc's 64 KiB netlink request as 2 bytes a slot: 16384 slots fit."""
STAB_DEFAULT_MTU = 2047
STAB_DEFAULT_TSIZE = 512


@dataclass(frozen=True, slots=True)
class Preset:
    """A named encapsulation: its overhead beyond the IP packet, its link layer, its mpu."""

    name: str
    overhead: int
    linklayer: LinkLayerName
    mpu: int
    what: str


def _p(name: str, overhead: int, linklayer: LinkLayerName, mpu: int, what: str) -> Preset:
    return Preset(name, overhead, linklayer, mpu, what)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        _p("conservative", 48, "atm", 0, "a safe over-estimate: one whole ATM cell of overhead"),
        _p("pppoa-vcmux", 10, "atm", 0, "ADSL, PPPoA with VC-mux"),
        _p("pppoa-llc", 14, "atm", 0, "ADSL, PPPoA with LLC"),
        _p("pppoe-vcmux", 32, "atm", 0, "ADSL, PPPoE with VC-mux"),
        _p("pppoe-llc", 40, "atm", 0, "ADSL, PPPoE with LLC/SNAP"),
        _p("bridged-vcmux", 24, "atm", 0, "ADSL, bridged Ethernet with VC-mux"),
        _p("bridged-llc", 32, "atm", 0, "ADSL, bridged Ethernet with LLC/SNAP"),
        _p("ipoa-vcmux", 8, "atm", 0, "ADSL, IP over ATM with VC-mux"),
        _p("ipoa-llc", 16, "atm", 0, "ADSL, IP over ATM with LLC/SNAP"),
        _p("pppoe-ptm", 30, "ptm", 0, "VDSL2, PPPoE over PTM"),
        _p("bridged-ptm", 22, "ptm", 0, "VDSL2, bridged Ethernet over PTM"),
        _p("docsis", 18, "ethernet", 64, "DOCSIS cable: Ethernet frame with FCS"),
        _p("ethernet", 38, "ethernet", 84, "Ethernet: header, FCS, preamble and gap"),
        _p("ether-vlan", 42, "ethernet", 84, "Ethernet with one 802.1Q VLAN tag"),
    )
}
"""tc-cake(8)'s keywords (sqm-scripts and FireQOS document the same numbers)."""

PRESET_ALIASES = {
    "pppoe-llcsnap": "pppoe-llc",
    "bridged-llcsnap": "bridged-llc",
    "ipoa-llcsnap": "ipoa-llc",
}
"""tc's own spellings of the LLC presets."""

LINKLAYERS: dict[str, LinkLayerName] = {
    "ethernet": "ethernet",
    "atm": "atm",
    "adsl": "atm",
    "ptm": "ptm",
}
"""``linklayer`` words: tc's stab takes ethernet, atm and adsl (atm); cake also takes ptm."""

RTT_PRESETS: dict[str, int] = {
    "datacentre": 100,
    "lan": 1_000,
    "metro": 10_000,
    "regional": 30_000,
    "internet": 100_000,
    "oceanic": 300_000,
    "satellite": 1_000_000,
    "interplanetary": 1_000_000_000,
}
"""cake's named round-trip times, in microseconds (q_cake.c; each one's target is rtt / 20)."""


def preset(name: str) -> Preset | None:
    """The preset called ``name`` (tc's ``-llcsnap`` spellings too), or None."""
    return PRESETS.get(PRESET_ALIASES.get(name, name))


def wire_size(ip_len: int, overhead: int, linklayer: LinkLayerName, mpu: int) -> int:
    """The bytes an IP packet of ``ip_len`` costs on the link (sch_cake.c's
    cake_calc_overhead after it stripped the MAC header)."""
    size = max(ip_len + overhead, mpu)
    if linklayer == "atm":
        return -(-size // ATM_PAYLOAD) * ATM_CELL
    if linklayer == "ptm":
        return size + (size + 63) // 64
    return size


def atm_cells(ip_len: int, overhead: int, mpu: int = 0) -> int:
    """How many ATM cells an IP packet of ``ip_len`` fills."""
    return wire_size(ip_len, overhead, "atm", mpu) // ATM_CELL


FRAME = 1514
"""The largest packet on an Ethernet device without GSO: 1500 bytes of IP and the 14-byte
Ethernet header (``skb->len`` on egress)."""


def charged_frame(stab: Overhead | None) -> int:
    """What the kernel charges a full-size frame (:data:`FRAME`) on a device whose root has the
    size table of ``stab``: the length its qdiscs, classes and policers meter the frame by
    (qdisc_pkt_len), 1749 bytes with ``overhead pppoe-llc``."""
    return FRAME if stab is None else stab.size_table().cost(FRAME)


def frame_words(charged: int) -> str:
    """A full-size frame charged ``charged`` bytes (:func:`charged_frame`), as the messages
    about it say it."""
    if charged == FRAME:
        return f"a full-size Ethernet frame ({FRAME} bytes)"
    charges = f"{charged} as the interface's size table charges it"
    return f"a full-size Ethernet frame ({FRAME} bytes, {charges})"


def stab_overhead(overhead: int) -> int:
    """The overhead a stab adds to ``skb->len`` for tcdsl's ``overhead`` (beyond the IP packet)
    on an Ethernet device."""
    return overhead - ETHERNET_HEADER


@dataclass(frozen=True, slots=True)
class SizeTable:
    """A stab as tc builds it (tc_core.c's tc_calc_size_table) and the kernel applies it."""

    overhead: int
    """Added to ``skb->len``."""
    linklayer: LinkLayerName
    mpu: int
    mtu: int
    tsize: int

    @property
    def has_table(self) -> bool:
        """tc sends no table (only the overhead) for Ethernet without an mpu."""
        return self.linklayer == "atm" or self.mpu != 0

    @property
    def cell_bytes(self) -> int:
        """The lengths its slots step by (tc's cell_log)."""
        return 1 << self._layout()[0]

    def _layout(self) -> tuple[int, int, tuple[int, ...]]:
        return _stab_layout(self.linklayer, self.mpu, self.mtu, self.tsize)

    def cost(self, skb_len: int) -> int:
        """The size the kernel charges for a packet of ``skb_len`` (qdisc_calc_pkt_len)."""
        length = skb_len + self.overhead
        if self.has_table:
            cell_log, size_log, data = self._layout()
            slot = max(length - 1, 0) >> cell_log  # tc sets cell_align to -1
            if slot < self.tsize:
                length = data[slot]
            else:
                length = data[-1] * (slot // self.tsize) + data[slot % self.tsize]
            length <<= size_log
        return max(length, 1)


@functools.cache
def _stab_layout(
    linklayer: LinkLayerName, mpu: int, mtu: int, tsize: int
) -> tuple[int, int, tuple[int, ...]]:
    """The cell_log, size_log and slots tc computes for a size table (made once for each: the
    simulator charges every packet through it)."""
    cell_log = 0
    while (mtu >> cell_log) > tsize - 1:
        cell_log += 1
    size_log = 0
    while True:
        data = []
        for i in range(tsize):
            size = max((i + 1) << cell_log, mpu)
            if linklayer == "atm":
                size = -(-size // ATM_PAYLOAD) * ATM_CELL
            data.append(size >> size_log)
        if max(data) <= 0xFFFF:
            return cell_log, size_log, tuple(data)
        size_log += 1


def stab_for(
    overhead: int, linklayer: LinkLayerName, mpu: int, mtu: int | None, tsize: int | None
) -> SizeTable:
    """The size table tcdsl writes for ``overhead`` (beyond the IP packet) and the rest."""
    return SizeTable(
        stab_overhead(overhead),
        linklayer,
        mpu,
        mtu or STAB_DEFAULT_MTU,
        tsize or STAB_DEFAULT_TSIZE,
    )
