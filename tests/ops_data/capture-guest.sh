# How the uml-* captures were made: run in the Debian 6.1 guest (tcdsl.kernels.uml) by
# tests/test_status.py, which also parses its output again. Each section starts with
# "==NAME" on a line of its own: NAME.qdisc.json or NAME.class.txt.
set -e
ip link add d0 type dummy
ip link set d0 up
ip addr add 10.7.0.1/24 dev d0
tc qdisc add dev d0 root handle 1: htb default 30
tc class add dev d0 parent 1: classid 1:1 htb rate 10mbit
tc class add dev d0 parent 1:1 classid 1:10 htb rate 4mbit ceil 10mbit
tc class add dev d0 parent 1:1 classid 1:20 htb rate 3mbit ceil 10mbit
tc class add dev d0 parent 1:1 classid 1:30 htb rate 1mbit ceil 2mbit
tc qdisc add dev d0 parent 1:10 handle 10: fq_codel
tc qdisc add dev d0 parent 1:20 handle 20: cake bandwidth 3mbit
tc qdisc add dev d0 parent 1:30 handle 30: sfq perturb 10
tc filter add dev d0 parent 1: protocol ip prio 1 u32 match ip dst 10.7.0.2/32 flowid 1:10
tc filter add dev d0 parent 1: protocol ip prio 2 u32 match ip dst 10.7.0.3/32 flowid 1:20
ping -c 5 -i 0.01 -W 1 10.7.0.2 >/dev/null 2>&1 || true
ping -c 4 -i 0.01 -W 1 10.7.0.3 >/dev/null 2>&1 || true
ping -c 3 -i 0.01 -W 1 10.7.0.4 >/dev/null 2>&1 || true
echo ==uml-htb-leaves.qdisc.json; tc -s -j qdisc show dev d0; echo
echo ==uml-htb-leaves.class.txt; tc -s -j class show dev d0
tc qdisc del dev d0 root
tc qdisc add dev d0 root handle 1: cake bandwidth 5mbit diffserv4
ping -c 4 -i 0.01 -W 1 10.7.0.3 >/dev/null 2>&1 || true
echo ==uml-cake-root.qdisc.json; tc -s -j qdisc show dev d0; echo
echo ==uml-cake-root.class.txt; tc -s -j class show dev d0
tc qdisc del dev d0 root
tc qdisc add dev d0 root handle 1: fq_codel
ping -c 4 -i 0.01 -W 1 10.7.0.3 >/dev/null 2>&1 || true
echo ==uml-fq_codel-root.qdisc.json; tc -s -j qdisc show dev d0; echo
