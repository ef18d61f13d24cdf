"""The registry of diagnostic codes: each code's severity and a one-line title.

EVERY NEW CODE NEEDS AN ENTRY HERE (and a row in docs/diagnostics.md): SARIF output takes its
rules from this table, and ``--disable`` and ``# tcdsl: disable=...`` comments check codes
against it. tests/test_check_cli.py fails while the table and the documentation disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from tcdsl.diagnostics import Severity


@dataclass(frozen=True, slots=True)
class CodeInfo:
    """What a code is: its severity and a one-line title (a sentence without final stop)."""

    severity: Severity
    title: str


_E, _W, _I = Severity.ERROR, Severity.WARNING, Severity.INFO

_TABLE: dict[str, CodeInfo] = {
    # E0xx: syntax and values
    "E001": CodeInfo(_E, "Syntax error"),
    "E002": CodeInfo(_E, "A character that cannot start anything in the language"),
    "E004": CodeInfo(_E, "A rate or a time without a unit"),
    "E005": CodeInfo(_E, "A unit that tc does not know for this kind of value"),
    "E006": CodeInfo(_E, "A file that cannot be read, or an include cycle"),
    "E007": CodeInfo(_E, "A parameter or flag the qdisc or class does not take"),
    "E009": CodeInfo(_E, "An interface name Linux would refuse"),
    "E010": CodeInfo(_E, "An IPv4 address or network that does not parse"),
    "E011": CodeInfo(_E, "A value of the wrong kind"),
    "E012": CodeInfo(_E, "A percentage where none is allowed"),
    "E013": CodeInfo(_E, "Arithmetic that divides by zero or gives a negative value"),
    "E014": CodeInfo(_E, "Something given twice, or classify in the wrong place"),
    "E015": CodeInfo(_E, "An unknown protocol name or number"),
    "E016": CodeInfo(_E, "A tos, dscp or raw match value that does not fit its field"),
    "E017": CodeInfo(_E, "A match directly on a qdisc instead of in a class"),
    "E018": CodeInfo(_E, "A structure tc cannot build"),
    "E019": CodeInfo(_E, "A required parameter is missing"),
    "E020": CodeInfo(_E, "Blocks or expressions nested too deeply"),
    "E021": CodeInfo(_E, "tcdsl fmt would move code away from its disable comment"),
    "E022": CodeInfo(_E, "A file that is not UTF-8 text, or that holds NUL bytes"),
    "E023": CodeInfo(_E, "An include or a linked file outside the policy's directory"),
    "E024": CodeInfo(_E, "A policy or include that is not a regular file"),
    "E025": CodeInfo(_E, "A policy or include larger than tcdsl reads"),
    "E026": CodeInfo(_E, "A number with more digits than tcdsl reads"),
    "E027": CodeInfo(_E, "A subscriber table that cannot be read"),
    "E028": CodeInfo(
        _E, "A subscriber table without a column it needs, or a row without a circuit id"
    ),
    "E029": CodeInfo(_E, "An address in a subscriber table that does not parse"),
    "E030": CodeInfo(_E, "A rate in a subscriber table that is not a number of Mbps"),
    "E031": CodeInfo(_E, "A subscriber whose min rate is above its max"),
    "E032": CodeInfo(_E, "Rows of one circuit with different rates or parent nodes"),
    "E033": CodeInfo(_E, "A 'where' on a column the subscriber table does not have"),
    "E034": CodeInfo(_E, "A subscribers statement that selects no row of its table"),
    "E035": CodeInfo(_E, "A quote in a subscriber table left open over lines that look like rows"),
    "E036": CodeInfo(_E, "A subscriber's address inside the prefix of another tried before it"),
    "E037": CodeInfo(_E, "A circuit taken by two subscribers statements of one tree"),
    "E038": CodeInfo(_E, "The count of a subscriber table's errors past the first 50"),
    "E039": CodeInfo(_E, "A row of a subscriber table cut short: fewer cells than its header"),
    # E1xx: names
    "E101": CodeInfo(_E, "A constant or class defined twice"),
    "E102": CodeInfo(_E, "An htb default that names no class of the htb"),
    "E103": CodeInfo(_E, "An unknown constant"),
    "E104": CodeInfo(_E, "An interface declared twice"),
    # E2xx: semantics
    "E202": CodeInfo(_E, "A class ceil below its rate"),
    "E204": CodeInfo(_E, "A handle or class id tc would reject, or that collides"),
    "E205": CodeInfo(_E, "A number outside the range the kernel takes"),
    "E206": CodeInfo(_E, "A match on a class that has child classes"),
    "E207": CodeInfo(_E, "A port, pref or mark out of range, or a mark used twice"),
    "E208": CodeInfo(_E, "A value that cannot work (0%, a rate below 8bit, beyond 32 bits)"),
    "E209": CodeInfo(_E, "A match iptables cannot express with classify by mark"),
    "E210": CodeInfo(_E, "No free qdisc handle or class id is left"),
    "E211": CodeInfo(_E, "A match line that can never match"),
    "E212": CodeInfo(_E, "An htb class tree deeper than the kernel's 8 levels"),
    "E213": CodeInfo(_E, "A qdisc or classifier the target kernel does not have"),
    "E214": CodeInfo(_E, "Ports on a match whose protocol has no ports"),
    "E215": CodeInfo(_E, "An iptables chain name that is a built-in chain or a target"),
    "E216": CodeInfo(_E, "An iptables chain name with characters or a length tcdsl does not take"),
    "E220": CodeInfo(_E, "A match or mark classify by mark cannot reach (a nested qdisc)"),
    "E251": CodeInfo(_E, "Both a download and ingress policers on one interface"),
    "E252": CodeInfo(
        _E,
        "A policer that cannot work: missing rate or burst, no policer on "
        "an ingress match, or policing with classify by mark",
    ),
    "E253": CodeInfo(_E, "A policer burst below the largest packet it must pass"),
    "E254": CodeInfo(_E, "A download's IFB that another tree of the policy uses"),
    "E255": CodeInfo(_E, "A download classified by firewall mark without connmark"),
    "E256": CodeInfo(_E, "A download's marking rules set where the download never passes"),
    "E257": CodeInfo(_E, "'proto ipv6' or 'proto ipv4', which name tunnels, not families"),
    "E258": CodeInfo(_E, "A match line asking for an address family its tree or values exclude"),
    "E259": CodeInfo(_E, "A condition flower cannot say under 'classifier flower'"),
    "E260": CodeInfo(_E, "A pref above 32767 in a tree with IPv6 filters"),
    "E261": CodeInfo(_E, "More policed lines of several filters than a tree's police indexes"),
    "E262": CodeInfo(_E, "More u32 filters at one pref than kept in order, no table id left"),
    "E263": CodeInfo(_E, "More u32 prefs under one parent, or flower filters, than the kernel has"),
    "E264": CodeInfo(_E, "A policer that continues or reclassifies in an mq tree"),
    "E266": CodeInfo(_E, "mq, or a 'queue N', somewhere other than an interface's root mq"),
    "E267": CodeInfo(_E, "An mq spreading a tree it cannot spread (not htb, no queue count)"),
    "E268": CodeInfo(_E, "An mq tree with marks, ingress policers or a download (clsact's slot)"),
    "E269": CodeInfo(_E, "An mq queue number out of range or given twice"),
    "E270": CodeInfo(_E, "A subscribers statement's template that cannot apply to every row"),
    "E271": CodeInfo(_E, "A subscribers statement outside an htb"),
    "E272": CodeInfo(_E, "A subscribers statement in a tree whose direction it cannot know"),
    "E273": CodeInfo(_E, "Two trees' marks that share bits, one's reaching the other's"),
    # E27x: tcdsl import
    "E235": CodeInfo(_E, "An hfsc service curve tc refuses (two zero slopes, umax without dmax)"),
    "E236": CodeInfo(_E, "An hfsc class without an rt or ls curve"),
    "E237": CodeInfo(_E, "An hfsc ul curve without an ls curve"),
    "E238": CodeInfo(_E, "An hfsc class with children but no ls curve"),
    "E230": CodeInfo(_E, "A link-layer or cake value tc refuses, leaves out or drops"),
    "E231": CodeInfo(_E, "An unknown name where a preset, link layer, rtt or isolation goes"),
    "E232": CodeInfo(_E, "Link-layer words where a size table cannot take them"),
    "E233": CodeInfo(_E, "cake keywords that contradict each other"),
    "E240": CodeInfo(_E, "red thresholds or netem slots tc refuses"),
    "E245": CodeInfo(_E, "A mark mask of no bits or more than 32 bits"),
    "E246": CodeInfo(_E, "A mark outside the mark mask, or a mask too narrow for the marks"),
    "E247": CodeInfo(_E, "tcp-flags that cannot match (a set flag not examined, not TCP)"),
    "E248": CodeInfo(_E, "set dscp that nothing applies (no classify by mark, no mark)"),
    "E249": CodeInfo(_E, "A match line's pref equal to the fw filters' pref"),
    # W3xx: warnings
    "W301": CodeInfo(
        _W, "A ceil above the parent's ceiling (or a root class's rate), which is never reached"
    ),
    "W302": CodeInfo(_W, "A rate in bytes-per-second units"),
    "W303": CodeInfo(_W, "A class mark without classify by mark"),
    "W304": CodeInfo(_W, "Some combinations of a match line can never match"),
    "W305": CodeInfo(_W, "An sfq limit the kernel silently lowers"),
    "W306": CodeInfo(_W, "cbq, which Linux removed in 6.3"),
    "W307": CodeInfo(_W, "A tcdsl comment directive that names an unknown or error code"),
    "I308": CodeInfo(_I, "A disable comment that suppresses nothing"),
    "W308": CodeInfo(_W, "An empty policy (no interface, no constant): its script changes nothing"),
    "W309": CodeInfo(
        _W, "A class whose leaf qdisc shapes below its ceil, which can never be reached"
    ),
    "W310": CodeInfo(_W, "An htb without default: unmatched traffic goes out unshaped"),
    "W311": CodeInfo(_W, "An htb leaf class nothing can reach"),
    "W312": CodeInfo(_W, "A match line or value an earlier filter always takes first"),
    "W313": CodeInfo(_W, "The same match sends packets to two classes; the first wins"),
    "W314": CodeInfo(_W, "A catch-all match tried before other match lines"),
    "W315": CodeInfo(_W, "An htb burst or cburst smaller than one full-size frame"),
    "W316": CodeInfo(_W, "An htb r2q that puts class quanta where the kernel clamps them"),
    "W317": CodeInfo(
        _W, "A tbf burst below one frame or below rate / HZ, or a peakrate mtu below one frame"
    ),
    "W318": CodeInfo(_W, "An sfq perturb below 10 seconds"),
    "W319": CodeInfo(
        _W, "A fifo or tbf queue that drops everything, or every full-size frame (limit 0, 100)"
    ),
    "W323": CodeInfo(_W, "A size written in bit units (tc reads 10kbit as 1280 bytes)"),
    "I320": CodeInfo(_I, "Children may borrow far more than the parent's ceiling"),
    "I321": CodeInfo(_I, "A tree that classifies IPv4 only: where its IPv6 packets go"),
    "W321": CodeInfo(_W, "A netem limit below the packets its delay keeps inside"),
    "W322": CodeInfo(_W, "A class mark nothing in the policy sets"),
    "W330": CodeInfo(_W, "A value the kernel keeps, but not as written"),
    "W360": CodeInfo(_W, "A download match on a private destination, which NAT hides on ingress"),
    "W361": CodeInfo(_W, "A policer whose 'reclassify' loops until the kernel drops the packet"),
    "W362": CodeInfo(_W, "An IPv6 port match u32 reads in an extension header"),
    "W363": CodeInfo(_W, "Values of a match line left out: their family cannot match there"),
    "W364": CodeInfo(_W, "An IPv6 extension header as 'proto' under flower, which walks past it"),
    "W365": CodeInfo(_W, "An IPv4-mapped IPv6 address, which no IPv6 packet carries"),
    "W371": CodeInfo(_W, "Rows of a subscriber table that no statement of the tree takes"),
    "W372": CodeInfo(_W, "A device in a subscriber table without an address"),
    "W373": CodeInfo(_W, "Rows of a subscriber table with text past the header's columns"),
    "W374": CodeInfo(_W, "Two trees' marks that meet only in NAT loopback or WAN-to-WAN packets"),
    "W375": CodeInfo(_W, "'set dscp' with marks set before routing: other interfaces' packets too"),
    "W376": CodeInfo(_W, "A police mtu below a full frame (as the size table charges it)"),
    "W377": CodeInfo(_W, "A circuit whose rows a tree's subscribers statements take only some of"),
    "W378": CodeInfo(_W, "A written class with the name a table's circuit would have"),
    "W379": CodeInfo(_W, "A class's 'prio' written after a match (tc's filter prio is 'pref')"),
    "W380": CodeInfo(_W, "A tos match that tests the ECN bits (ECN-capable packets miss it)"),
    "W381": CodeInfo(_W, "A preset's size table on a device named as one without a MAC header"),
    "W382": CodeInfo(_W, "A subscriber table ending without a line break in a cell that shapes"),
    "W368": CodeInfo(_W, "mq queues N with fewer top-level classes than queues"),
    # W37x: tcdsl import, what the language cannot say (also a comment in the policy)
    "W345": CodeInfo(_W, "An hfsc without a default class: it drops unclassified packets"),
    "W346": CodeInfo(_W, "An rt curve on an hfsc class with children, which the kernel ignores"),
    "W347": CodeInfo(_W, "Real-time guarantees above an hfsc ancestor's ul"),
    "W348": CodeInfo(_W, "hfsc children whose ls curves sum above their parent's"),
    "W349": CodeInfo(_W, "An hfsc ul below the class's rt, which the kernel serves anyway"),
    "W340": CodeInfo(_W, "Link-layer overhead on an interface where nothing shapes"),
    "W341": CodeInfo(_W, "A cake with its own overhead below a size table: counted twice"),
    "W342": CodeInfo(_W, "Link-layer words without an overhead: 0 bytes beyond the IP packet"),
    "W350": CodeInfo(_W, "Children guaranteed more than their parent has, without 'overbook'"),
    "W351": CodeInfo(_W, "An 'overbook' on a class whose children fit its rate"),
    "W352": CodeInfo(_W, "red thresholds that leave RED little to do, or a burst tc warns about"),
    "W353": CodeInfo(_W, "A red without bandwidth, which tc replaces with 10Mbit"),
    "W355": CodeInfo(_W, "A u32 match line after fw filters that take every packet"),
    # E4xx: kernel verification
    "E401": CodeInfo(_E, "An object of the policy is missing in the kernel"),
    "E402": CodeInfo(_E, "An object has another value in the kernel"),
    "E403": CodeInfo(_E, "The kernel holds an object the policy does not create"),
    "E404": CodeInfo(_E, "The script failed"),
    "E405": CodeInfo(_E, "The kernel lacks a feature the policy needs"),
    "W406": CodeInfo(_W, "A tool warned while applying a command"),
    # E6xx: live operations (plan, apply, rollback, down)
    "E601": CodeInfo(_E, "A command of apply failed; the previous state was restored"),
    "E602": CodeInfo(_E, "A device the policy (or -i) names does not exist here"),
    "E603": CodeInfo(_E, "No policy is applied (or waits) under that name"),
    "E604": CodeInfo(_E, "The kernel or its tools lack what the policy needs; nothing changed"),
    "E605": CodeInfo(_E, "import: the saved tc text cannot be read"),
    "E606": CodeInfo(_E, "import: the interface has no traffic-control configuration"),
    "E607": CodeInfo(_E, "import: a root qdisc of a kind the language has not"),
    "E608": CodeInfo(_E, "import: tc could not read the live state"),
    "E609": CodeInfo(_E, "import: the policy written does not compile (a bug of import's)"),
    "W609": CodeInfo(_W, "apply: recorded, but what it built was not kept (a cache)"),
    "W610": CodeInfo(_W, "import: a qdisc of a kind the language has not, left out"),
    "W611": CodeInfo(_W, "import: a qdisc or class parameter the language cannot set"),
    "W612": CodeInfo(_W, "import: a filter of a kind the language has not, left out"),
    "W613": CodeInfo(_W, "import: a u32 filter no match line gives (hash tables, offsets)"),
    "W614": CodeInfo(_W, "import: a filter action other than police, left out"),
    "W615": CodeInfo(_W, "import: filters whose order no policy writes"),
    "W616": CodeInfo(_W, "import: fw filters written as 'classify by mark', rules not read"),
    "W617": CodeInfo(_W, "import: one policer shared by several lines, written as several"),
    "W618": CodeInfo(_W, "import: a download whose IFB tree is not in the text read"),
    "W619": CodeInfo(_W, "import: a line that is not tc's qdisc, class or filter output"),
    "W620": CodeInfo(_W, "import: a download redirect not tcdsl's, written as tcdsl's"),
    "W621": CodeInfo(_W, "import: a filter to an inner htb class, written to the default"),
    "W622": CodeInfo(_W, "import: an mq tree's queue steering is not what the policy makes"),
    # E5xx: backend limits
    "E501": CodeInfo(_E, "The backend cannot express a construct of the policy"),
    "E502": CodeInfo(_E, "A word or command has no spelling in the output format"),
}

CODES: Mapping[str, CodeInfo] = MappingProxyType(_TABLE)
"""Every diagnostic code tcdsl reports, by code."""

RETIRED: Mapping[str, str] = MappingProxyType(
    {
        "E201": "over-booking a parent's rate is warning W350 now (the kernel accepts it)",
        "E203": "over-booking a parent's ceil is warning W350 now (the kernel accepts it)",
    }
)
"""Codes tcdsl no longer reports, with what took their place. A retired code keeps its number:
it is never given a new meaning (docs/diagnostics.md, "Retired codes")."""
