/* Offers a device as many full-size (1514-byte) UDP frames as it takes for argv[2] seconds,
   written on an AF_PACKET socket (so through its egress qdisc): bench/burst_bench.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <arpa/inet.h>
int main(int argc, char **argv) {
    int ifindex = if_nametoindex(argv[1]);
    double secs = atof(argv[2]);
    int fd = socket(AF_PACKET, SOCK_RAW, 0);
    unsigned char f[1514]; memset(f, 0, sizeof f);
    memset(f, 0xff, 6); f[6]=2; f[12]=0x08; f[13]=0x00;
    f[14]=0x45; f[16]=0x05; f[17]=0xdc; f[22]=64; f[23]=17;
    f[26]=10; f[29]=1; f[30]=10; f[33]=2;
    struct sockaddr_ll to = {0}; to.sll_family = AF_PACKET; to.sll_ifindex = ifindex; to.sll_halen = 6; memset(to.sll_addr, 0xff, 6);
    struct timespec t0, t; clock_gettime(CLOCK_MONOTONIC, &t0);
    long n = 0, ok = 0;
    for (;;) {
        if (sendto(fd, f, sizeof f, 0, (struct sockaddr*)&to, sizeof to) == sizeof f) ok++;
        if (++n % 1000 == 0) { clock_gettime(CLOCK_MONOTONIC, &t); if ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec)/1e9 > secs) break; }
    }
    printf("sent %ld ok %ld\n", n, ok);
    return 0;
}
