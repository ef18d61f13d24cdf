# A script with what the language cannot say, for tcdsl import's warnings.
DEV=eth0
tc qdisc add dev $DEV root handle 1: htb default 20 direct_qlen 50
tc class add dev $DEV parent 1: classid 1:1 htb rate 10mbit
tc class add dev $DEV parent 1:1 classid 1:10 htb rate 5mbit ceil 10mbit
tc class add dev $DEV parent 1:1 classid 1:20 htb rate 3mbit ceil 10mbit
tc class add dev $DEV parent 1:1 classid 1:30 htb rate 2mbit ceil 10mbit
tc qdisc add dev $DEV parent 1:10 handle 10: sfq perturb 10 flows 256
tc qdisc add dev $DEV parent 1:30 handle 30: sfb
tc filter add dev $DEV parent 1: protocol ip prio 1 u32 match ip dport 22 0xffff flowid 1:10
tc filter add dev $DEV parent 1: protocol ip prio 1 u32 match ip dport 80 0xffff flowid 1:20
tc filter add dev $DEV parent 1: protocol ip prio 1 u32 match ip dport 23 0xffff flowid 1:10
tc filter add dev $DEV parent 1: protocol ip prio 2 matchall flowid 1:30
tc filter add dev $DEV parent 1: prio 3 handle 2: protocol ip u32 divisor 256
tc filter add dev $DEV parent 1: protocol ip prio 3 u32 ht 800:: match ip dst 10.0.0.0/8 hashkey mask 0x000000ff at 16 link 2:
tc filter add dev $DEV parent 1: protocol ip prio 4 u32 match ip dport 25 0xffff flowid 1:30 action drop
tc filter add dev $DEV parent 1: protocol ip prio 5 handle 7 fw flowid 1:20
tc filter add dev $DEV parent 1: protocol ipv6 prio 6 u32 match ip6 dst 2001:db8::/32 flowid 1:20
tc actions add action police rate 1mbit burst 10k drop index 5
tc filter add dev $DEV parent 1: protocol ip prio 7 u32 match ip dport 443 0xffff flowid 1:20 action police index 5
tc filter add dev $DEV parent 1: protocol ip prio 7 u32 match ip sport 443 0xffff flowid 1:10 action police index 5
tc qdisc add dev $DEV handle ffff: ingress
tc filter add dev $DEV parent ffff: protocol all prio 1 u32 match u32 0 0 action mirred egress redirect dev ifb0
